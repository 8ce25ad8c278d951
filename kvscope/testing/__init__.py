"""Test doubles, shipped on purpose and apart from the product (as OpenTelemetry ships its
``InMemorySpanExporter``): for tests, benchmarks and notebooks. No other kvscope package imports
this one (an import-linter contract says so).

* :class:`FakeClock` (:mod:`.clock`): a monotonic ns clock that moves only when told to;
* :mod:`.incident`: a hand-built, deterministic event stream shaped like the draft-pool incident.
"""

from kvscope.testing.clock import FakeClock

__all__ = ["FakeClock"]
