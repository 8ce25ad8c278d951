"""Traffic for the engine model: trace readers, the closed-loop driver and synthetic scenarios.

Every workload implements ``workload.Workload`` (arrivals out, finishes back in) and hands out
``WorkloadRequest`` records; it knows nothing of the engine it drives (``kvscope.replay`` composes
the two).
"""
