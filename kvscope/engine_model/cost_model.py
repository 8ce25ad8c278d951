"""Step-time cost model of one executor iteration, with MTP speculative acceptance.

    step_seconds = step_overhead_s
                 + num_prefill_tokens  * prefill_s_per_token
                 + num_decode_requests * decode_s_per_request

Speculative decoding (MTP): each generation step of a request verifies ``max_draft_len`` draft
tokens; draft position i (1-based) is accepted with probability ``p ** i`` (a later position is only
accepted when every earlier one was), so the expected accepted drafts per step are
``sum(p ** i for i in 1..max_draft_len)`` and a step yields ``1 + accepted`` tokens.

Determinism and speed: instead of drawing a random number per request per step (which would make a
batched stretch of k decode steps cost O(k) per request), every request carries a fractional
*acceptance phase* in [0, 1), seeded once per request; over k steps it accepts
``floor(phase + k * E) - floor(phase)`` drafts. One step and a k-step stretch agree exactly, and the
long-run acceptance equals the expected value. The constants and their public sources are listed in
COST_SOURCES.md; this model has no TensorRT-LLM source of its own (the real engine measures time).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class CostModel:
    """Constants of the step-time model (seconds) and the MTP acceptance rate."""

    step_overhead_s: float
    """Fixed time of one iteration: scheduling, launch, sampling, PP bubbles (s)."""
    prefill_s_per_token: float
    """Time per prompt token computed in a context chunk (s)."""
    decode_s_per_request: float
    """Time per generation request per iteration, including verifying its draft tokens (s)."""
    mtp_acceptance_rate: float
    """Probability that the next draft position is accepted, given the previous one was."""
    max_draft_len: int
    """Draft tokens proposed per step (0: no speculation)."""
    _expected_accepted: float = field(init=False, repr=False, compare=False, default=0.0)

    def __post_init__(self) -> None:
        for name in ("step_overhead_s", "prefill_s_per_token", "decode_s_per_request"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 0.0 <= self.mtp_acceptance_rate <= 1.0:
            raise ValueError(f"mtp_acceptance_rate must be in [0, 1], got {self.mtp_acceptance_rate}")
        if self.max_draft_len < 0:
            raise ValueError(f"max_draft_len must be >= 0, got {self.max_draft_len}")
        p = self.mtp_acceptance_rate
        object.__setattr__(self, "_expected_accepted", sum(p ** i for i in range(1, self.max_draft_len + 1)))

    @classmethod
    def from_config(cls, config: object) -> CostModel:
        """Build from an ``EngineConfig`` (duck-typed to keep this module free of imports)."""
        return cls(
            step_overhead_s=config.step_overhead_s,  # type: ignore[attr-defined]
            prefill_s_per_token=config.prefill_s_per_token,  # type: ignore[attr-defined]
            decode_s_per_request=config.decode_s_per_request,  # type: ignore[attr-defined]
            mtp_acceptance_rate=config.mtp_acceptance_rate,  # type: ignore[attr-defined]
            max_draft_len=config.max_draft_len,  # type: ignore[attr-defined]
        )

    def step_seconds(self, num_prefill_tokens: int, num_decode_requests: int) -> float:
        """Simulated duration of one iteration with the given work (s)."""
        return (self.step_overhead_s + num_prefill_tokens * self.prefill_s_per_token
                + num_decode_requests * self.decode_s_per_request)

    @property
    def expected_accepted_drafts(self) -> float:
        """Expected accepted draft tokens per generation step."""
        return self._expected_accepted

    @property
    def expected_tokens_per_step(self) -> float:
        """Expected tokens a generation request gains per step (1 + accepted drafts)."""
        return 1.0 + self.expected_accepted_drafts

    def accepted_drafts(self, phase: float, num_steps: int = 1) -> tuple[int, float]:
        """Accepted draft tokens over ``num_steps`` steps from ``phase``; returns (total, new phase).

        Each single step accepts between 0 and ``max_draft_len`` drafts (E <= max_draft_len).
        """
        if num_steps < 0:
            raise ValueError(f"num_steps must be >= 0, got {num_steps}")
        end = phase + num_steps * self._expected_accepted
        floor_end = math.floor(end)
        return floor_end - math.floor(phase), end - floor_end

    def steps_to_generate(self, phase: float, num_tokens: int) -> int:
        """Fewest steps after which a request from ``phase`` has gained >= ``num_tokens`` tokens."""
        if num_tokens <= 0:
            return 0
        rate = self.expected_tokens_per_step
        steps = max(1, int(num_tokens / rate) - 1)
        while True:  # the estimate is at most a step or two short; walk up exactly
            accepted, _ = self.accepted_drafts(phase, steps)
            if steps + accepted >= num_tokens:
                # step back while the previous count still reaches it (estimate may overshoot)
                while steps > 1:
                    prev_accepted, _ = self.accepted_drafts(phase, steps - 1)
                    if steps - 1 + prev_accepted < num_tokens:
                        break
                    steps -= 1
                return steps
            steps += 1
