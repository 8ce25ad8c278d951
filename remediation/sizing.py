"""Pool sizing at engine start: how to split one KV byte budget between the target and draft pools.

The engine splits the budget so both pools hold about the same number of TOKENS
(``KvCacheCreator._split_kv_cache_budget_for_draft``: each pool's share is proportional to its bytes
per token). With prefix reuse the target backs many times its token count, while an unpaired draft
mirror holds every request's whole prompt. The draft pool is cheap per token (glm5-dsa: 1,284 vs
49,968 B/token), so giving it several times the target's tokens costs the target little: at 4x the
draft gets about 9% of the bytes instead of 2.5%, and the target loses about 7% of its tokens.

:func:`plan_split` computes the split for a draft-to-target token ratio (or a byte share) with the
engine's own affine cost model; :func:`ratio_from_observation` turns observed usage (a recorded run's
peak draft and target tokens in use, from the analyzer or a probe replay) into a ratio.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class SizingPlan:
    """One split of the KV byte budget."""

    draft_token_ratio: float
    """Draft tokens per target token."""
    draft_byte_share: float
    """Fraction of the budget (after fixed costs) given to the draft pool."""
    target_tokens: int
    draft_tokens: int
    target_blocks: int
    draft_blocks: int
    basis: str
    """Where the ratio came from ('explicit share 0.09', 'observed: ...', 'stock')."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan_split(total_bytes: int, *, target_bytes_per_token: int, draft_bytes_per_token: int,
               tokens_per_block: int, draft_token_ratio: float | None = None,
               draft_byte_share: float | None = None, target_fixed_bytes: int = 0,
               draft_fixed_bytes: int = 0, basis: str = "") -> SizingPlan:
    """Split ``total_bytes`` for a draft-to-target token ratio or a draft byte share (give one).

    Raises:
        ValueError: neither or both given, a share outside (0, 1), a ratio <= 0, or a budget that
            does not cover the fixed costs.
    """
    if (draft_token_ratio is None) == (draft_byte_share is None):
        raise ValueError("give exactly one of draft_token_ratio and draft_byte_share")
    if target_bytes_per_token <= 0 or draft_bytes_per_token <= 0 or tokens_per_block <= 0:
        raise ValueError("bytes per token and tokens per block must be > 0")
    budget = total_bytes - target_fixed_bytes - draft_fixed_bytes
    if budget <= 0:
        raise ValueError(f"the KV budget ({total_bytes} B) must exceed the fixed costs "
                         f"({target_fixed_bytes + draft_fixed_bytes} B)")
    if draft_byte_share is None:
        assert draft_token_ratio is not None
        if draft_token_ratio <= 0:
            raise ValueError(f"draft_token_ratio must be > 0, got {draft_token_ratio}")
        # target_tokens * t + ratio * target_tokens * d = budget
        draft_bytes_per_target_token = draft_token_ratio * draft_bytes_per_token
        draft_byte_share = draft_bytes_per_target_token / (target_bytes_per_token + draft_bytes_per_target_token)
    if not 0.0 < draft_byte_share < 1.0:
        raise ValueError(f"draft byte share must be in (0, 1), got {draft_byte_share}")
    draft_bytes = int(budget * draft_byte_share)
    target_tokens = (budget - draft_bytes) // target_bytes_per_token
    draft_tokens = draft_bytes // draft_bytes_per_token
    return SizingPlan(
        draft_token_ratio=round(draft_tokens / target_tokens, 6) if target_tokens else 0.0,
        draft_byte_share=round(draft_byte_share, 6), target_tokens=int(target_tokens),
        draft_tokens=int(draft_tokens), target_blocks=int(target_tokens // tokens_per_block),
        draft_blocks=int(draft_tokens // tokens_per_block),
        basis=basis or (f"draft token ratio {draft_token_ratio:g}" if draft_token_ratio is not None
                        else f"draft byte share {draft_byte_share:g}"))


def ratio_from_observation(peak_draft_tokens: float, peak_target_tokens: float, *, margin: float = 1.1,
                           minimum: float = 1.0, maximum: float = 16.0) -> float:
    """Draft-to-target token ratio that would have held the observed peaks, with ``margin``.

    ``peak_*_tokens``: the most tokens each pool held at once in a recorded run whose draft pool was
    not the limit (the analyzer's pool series, or a probe replay with an unlimited draft pool).
    """
    if peak_target_tokens <= 0:
        return minimum
    return max(minimum, min(maximum, margin * peak_draft_tokens / peak_target_tokens))


def parse_sizing(text: str) -> tuple[str, float | None]:
    """``--sizing`` value -> ('auto', None) | ('share', byte share) | ('ratio', token ratio).

    ``auto``; a byte share in (0, 1) such as ``0.09``; or a token ratio such as ``4x``.
    """
    text = text.strip().lower()
    if text == "auto":
        return "auto", None
    try:
        if text.endswith("x"):
            ratio = float(text[:-1])
            if ratio <= 0:
                raise ValueError
            return "ratio", ratio
        share = float(text)
    except ValueError:
        raise ValueError(f"--sizing expects auto, a draft byte share in (0, 1) (e.g. 0.09) or a draft "
                         f"token ratio (e.g. 4x); got {text!r}") from None
    if not 0.0 < share < 1.0:
        raise ValueError(f"--sizing share must be in (0, 1), got {share}")
    return "share", share


def split_bytes(total_bytes: int, target_cost: tuple[int, int], draft_cost: tuple[int, int], *,
                draft_byte_share: float | None = None, draft_token_ratio: float | None = None) -> tuple[int, int]:
    """``(target bytes, draft bytes)`` of ``total_bytes`` for a plan, from each pool's affine cost
    ``(bytes per token, fixed bytes)``: each pool keeps its fixed cost and the draft gets the plan's
    share of what remains (a token ratio r gives the share r*d / (t + r*d), as :func:`plan_split`).
    The engine's own split gives the draft d / (t + d) of it (ratio 1).

    Raises:
        ValueError: neither or both plans, a share outside (0, 1), a ratio <= 0, or fixed costs that
            leave nothing to split.
    """
    (t_slope, t_fixed), (d_slope, d_fixed) = target_cost, draft_cost
    if (draft_byte_share is None) == (draft_token_ratio is None):
        raise ValueError("give exactly one of draft_byte_share and draft_token_ratio")
    if t_slope <= 0 or d_slope <= 0:
        raise ValueError("bytes per token must be > 0 in both pools")
    remaining = total_bytes - t_fixed - d_fixed
    if remaining <= 0:
        raise ValueError(f"the KV budget ({total_bytes} B) must exceed the fixed costs ({t_fixed + d_fixed} B)")
    if draft_byte_share is None:
        assert draft_token_ratio is not None
        if draft_token_ratio <= 0:
            raise ValueError(f"draft_token_ratio must be > 0, got {draft_token_ratio}")
        draft_byte_share = draft_token_ratio * d_slope / (t_slope + draft_token_ratio * d_slope)
    if not 0.0 < draft_byte_share < 1.0:
        raise ValueError(f"draft byte share must be in (0, 1), got {draft_byte_share}")
    draft = d_fixed + int(remaining * draft_byte_share)
    return total_bytes - draft, draft


@dataclass(frozen=True, slots=True)
class BudgetSplit:
    """A sizing plan given at start (``KVSCOPE_SIZING``): called by the engine's budget-split hook
    with the total and the two affine costs, returns the two byte shares (:func:`split_bytes`)."""

    draft_byte_share: float | None = None
    draft_token_ratio: float | None = None

    @classmethod
    def parse(cls, text: str) -> BudgetSplit:
        """``0.09`` (draft byte share) or ``4x`` (draft tokens per target token). ``auto`` needs a
        recorded run, which an engine at start does not have.

        Raises:
            ValueError: anything else (one line, naming the valid forms).
        """
        kind, value = parse_sizing(text)
        if kind == "auto":
            raise ValueError("KVSCOPE_SIZING=auto needs a recorded run (use kvscope replay --sizing auto "
                             "--sizing-from EVENTS to get a ratio, then give it, e.g. 4x)")
        assert value is not None
        return cls(draft_byte_share=value) if kind == "share" else cls(draft_token_ratio=value)

    @property
    def label(self) -> str:
        return (f"draft_byte_share_{self.draft_byte_share:g}" if self.draft_byte_share is not None
                else f"draft_token_ratio_{self.draft_token_ratio:g}x")

    def __call__(self, total_bytes: int, target_cost: tuple[int, int], draft_cost: tuple[int, int]) -> tuple[int, int]:
        return split_bytes(total_bytes, target_cost, draft_cost, draft_byte_share=self.draft_byte_share,
                           draft_token_ratio=self.draft_token_ratio)
