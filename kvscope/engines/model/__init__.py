"""The engine-model side of the binding: the CPU model's classes and pool reader (same hooks)."""
