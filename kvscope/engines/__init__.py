"""kvscope.engines (see style.md section 6)."""
