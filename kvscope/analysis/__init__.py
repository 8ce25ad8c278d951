"""kvscope.analysis (see style.md section 6)."""
