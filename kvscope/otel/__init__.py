"""kvscope.otel (see style.md section 6)."""
