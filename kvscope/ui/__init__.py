"""kvscope.ui (see style.md section 6)."""
