"""The executor's error budget: whether an error handled per request should end the engine.

Stands for ``ErrorBudget`` / ``classify_error`` (``tensorrt_llm/_torch/pyexecutor/error_classification.py``),
which ``PyExecutor._handle_errors`` consults when ``charge_budget`` is True (``py_executor.py`` @
0004396720054fd8e205cbf616f21f0b57c6b412):

- ``classify_error`` (read at 02b70e9b06ed50a2b46e502d2267a29cd31db32a): a case-insensitive substring
  match; "immediate_fatal" for a corrupted CUDA context, "severe" for OOM / CUDA / NCCL errors,
  "transient" for everything else (bad input, timeouts, a missing IndexMapper id).
- the budget itself (a token bucket) was not read in source at a stored commit: its figures come
  from the map (``../shared/docs/trtllm-kv-v2.md`` section 2.8): a transient error costs 0.1, a severe
  one 0.5, the budget recovers 0.1 per second, and an immediate-fatal pattern is fatal at once. The
  full budget of 1.0 is the model's assumption (ten transient errors in a burst exhaust it).

Model-only choice: the clock is injected (simulated seconds), so recovery follows simulated time.
"""

from __future__ import annotations

from collections.abc import Callable

IMMEDIATE_FATAL_PATTERNS: tuple[str, ...] = (
    "cudaerrorillegaladdress", "cudaerrorlaunchfailure", "device-side assert", "unrecoverable",
)
SEVERE_ERROR_PATTERNS: tuple[str, ...] = ("cuda out of memory", "cuda error", "nccl error")

TRANSIENT_COST = 0.1
SEVERE_COST = 0.5
RECOVERY_PER_S = 0.1
FULL_BUDGET = 1.0


def classify_error(error_msg: str) -> str:
    """``"immediate_fatal"``, ``"severe"`` or ``"transient"`` (first matching pattern wins)."""
    lower = error_msg.lower()
    if any(p in lower for p in IMMEDIATE_FATAL_PATTERNS):
        return "immediate_fatal"
    if any(p in lower for p in SEVERE_ERROR_PATTERNS):
        return "severe"
    return "transient"


class ErrorBudgetModel:
    """Token bucket over simulated time; ``consume`` says whether the error is fatal.

    Args:
        now_s: simulated clock (seconds); the budget recovers between calls.
    """

    def __init__(self, now_s: Callable[[], float]) -> None:
        self._now_s = now_s
        self.budget = FULL_BUDGET
        self._last_s = now_s()

    def consume(self, error_msg: str) -> bool:
        """Charge one error; True when it is fatal (immediate pattern or budget exhausted)."""
        now = self._now_s()
        self.budget = min(FULL_BUDGET, self.budget + RECOVERY_PER_S * max(0.0, now - self._last_s))
        self._last_s = now
        kind = classify_error(error_msg)
        if kind == "immediate_fatal":
            return True
        self.budget = max(0.0, self.budget - (SEVERE_COST if kind == "severe" else TRANSIENT_COST))
        return self.budget < 1e-9
