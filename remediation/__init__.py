"""Live remediation of KV-pool admission gaps: draft-aware reservation, rejection of never-fitting
requests, containment, live toggle, pool sizing.

Depends on ``kvscope.events`` and ``kvscope.port`` only (enforced by import-linter): it plugs into a
running engine through an :class:`kvscope.port.AdmissionPort` and never patches anything.

    from remediation import attach, list_policies
    ctl = attach(port, mode="on")            # off | shadow | on | auto
    ctl.set_mode("shadow"); ctl.stats()
"""

from remediation.channel import (
    ControlRecord,
    ControlRecordError,
    FileControlChannel,
    LocalControlChannel,
)
from remediation.controller import (
    MODES,
    Controller,
    Mode,
    RemediationStats,
    attach,
    check_record,
    list_policies,
)
from remediation.ledger import Reservation, ReservationLedger
from remediation.policies import (
    DEFAULT_POLICY,
    POLICIES,
    DraftReservePolicy,
    JointAdmissionPolicy,
    WorstCasePolicy,
    create_policy,
)

__all__ = [
    "DEFAULT_POLICY",
    "MODES",
    "POLICIES",
    "ControlRecord",
    "ControlRecordError",
    "Controller",
    "DraftReservePolicy",
    "FileControlChannel",
    "JointAdmissionPolicy",
    "LocalControlChannel",
    "Mode",
    "RemediationStats",
    "Reservation",
    "ReservationLedger",
    "WorstCasePolicy",
    "attach",
    "check_record",
    "create_policy",
    "list_policies",
]
