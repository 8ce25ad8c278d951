"""Engine port: protocols between adapters and policies (filled in by the instrumentation issue)."""
