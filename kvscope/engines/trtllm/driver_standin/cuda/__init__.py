"""kvscope's accounting-only stand-in for NVIDIA's ``cuda`` package (not NVIDIA code; see bindings/driver.py)."""
