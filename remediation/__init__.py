"""Live remediation of KV-pool admission gaps (draft-aware reservation, containment, sizing).

Depends on ``kvscope.events`` and ``kvscope.port`` only (enforced by import-linter). The remediation
issue fills this package in; nothing here is implemented yet.
"""
