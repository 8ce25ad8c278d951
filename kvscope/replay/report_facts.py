"""The public reports' facts, each set beside the model's replay of the report's configuration.

One row per fact a report states about its own engine: which raise site ended it (or that it
survived), and one number to compare (the request it named, the requests it served, the time it
died). A row holds when the model reaches the same outcome through the same raise site and its
number is within a factor of 2 of the report's (for a reported range: of the range's nearest end).
``kvscope/engine_model/OUTCOMES.md`` prints the table (``python bench/outcomes_table.py --facts``);
``tests/integration/test_report_facts.py`` checks it, known misses included, so that neither a new
miss nor a silently mended one goes unseen.

Sources: the GLM report is TensorRT-LLM issue #18660 (1.3.0rc25, GLM-5.3 DSA, PP 2 / TP 4, MTP 1);
the hybrid report is a comment on it of 2026-09-23 (1.3.0rc27, a 27B Gated-DeltaNet hybrid, TP 2,
MTP 3, a synthetic client script). Their wording is paraphrased in ``fact``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .runner import ReplaySummary

__all__ = ["REPORT_FACTS", "FactCheck", "ReportFact", "check", "markdown_table"]

RESIZE = "context resize"
RESUME = "resume"
HEALTHY = "healthy"

_RESIZE_TOKENS = re.compile(r"could not resize to (\d+) tokens")


@dataclass(frozen=True, slots=True)
class ReportFact:
    """One fact of a report and the replay that stands for the report's configuration."""

    key: str
    report: str
    fact: str
    """What the report says, in one line."""
    scenario: str
    overrides: tuple[str, ...]
    outcome: str
    """``context resize``, ``resume`` (the raise site that ended the engine) or ``healthy``."""
    metric: str = ""
    """What is compared: ``fatal_request_id``, ``requests_completed``, ``sim_seconds`` or
    ``resize_tokens`` (the tokens the failed resize asked); empty: the outcome only."""
    reported: tuple[float, float] | None = None
    """The report's number as a range (low, high); a single number is (n, n)."""
    remediation: str = "off"


@dataclass(frozen=True, slots=True)
class FactCheck:
    """The model's side of one fact."""

    fact: ReportFact
    outcome: str
    value: float | None
    ratio: float | None
    """model / report (to the nearest end of a reported range); None without a number."""

    @property
    def outcome_holds(self) -> bool:
        return self.outcome == self.fact.outcome

    @property
    def holds(self) -> bool:
        """Same outcome, and the number (if any) within a factor of 2."""
        if not self.outcome_holds:
            return False
        return self.ratio is None or 0.5 <= self.ratio <= 2.0


GLM = "GLM #18660 (1.3.0rc25)"
HYBRID = "hybrid, #18660 comment (1.3.0rc27)"

REPORT_FACTS: tuple[ReportFact, ...] = (
    ReportFact("glm-64-site", GLM, "batch 64, reuse on: \"Draft KV cache context resize failed for request 186\"",
               "glm5-dsa", (), RESIZE, "fatal_request_id", (186, 186)),
    ReportFact("glm-64-served", GLM, "batch 64, reuse on: about 180 requests served before it",
               "glm5-dsa", (), RESIZE, "requests_completed", (180, 180)),
    ReportFact("glm-8-site", GLM, "batch 8, reuse on: \"Failed to resume draft KV cache for request 78\"",
               "glm5-dsa", ("max_batch_size=8",), RESUME, "fatal_request_id", (78, 78)),
    ReportFact("glm-8-served", GLM, "batch 8, reuse on: after 26 requests",
               "glm5-dsa", ("max_batch_size=8",), RESUME, "requests_completed", (26, 26)),
    ReportFact("glm-64-reuse-off", GLM, "batch 64: the failure goes away with enable_block_reuse: false",
               "glm5-dsa", ("enable_block_reuse=false",), HEALTHY),
    ReportFact("glm-8-reuse-off", GLM, "batch 8: the failure goes away with enable_block_reuse: false",
               "glm5-dsa", ("enable_block_reuse=false", "max_batch_size=8"), HEALTHY),
    ReportFact("hybrid-stock", HYBRID, "stock: \"Failed to resume draft KV cache\" at 80-107 s, after the warm-ups",
               "qwen-hybrid-mtp", (), RESUME, "sim_seconds", (80, 107)),
    ReportFact("hybrid-cursor", HYBRID, "draft cursor sizing alone: dies later, a context resize to 69,634 tokens",
               "qwen-hybrid-mtp", ("draft_cursor_sizing=chunk",), RESIZE, "resize_tokens", (69634, 69634)),
    ReportFact("hybrid-workaround", HYBRID, "cursor sizing + a draft reservation: 12/12 follow-ups in 375-480 s",
               "qwen-hybrid-mtp", ("draft_cursor_sizing=chunk",), HEALTHY, "sim_seconds", (375, 480),
               remediation="worst-case"),
)


def _outcome(summary: ReplaySummary) -> str:
    if not summary.engine_fatal:
        return HEALTHY
    message = summary.fatal_message or ""
    if message.startswith("Failed to resume draft KV cache"):
        return RESUME
    if message.startswith("Draft KV cache context resize failed"):
        return RESIZE
    return message.split(" for request")[0] or "fatal"


def _value(metric: str, summary: ReplaySummary) -> float | None:
    if not metric:
        return None
    if metric == "resize_tokens":
        match = _RESIZE_TOKENS.search(summary.fatal_message or "")
        return float(match.group(1)) if match else None
    value = getattr(summary, metric)
    return None if value is None else float(value)


def _ratio(value: float | None, reported: tuple[float, float] | None) -> float | None:
    if value is None or reported is None:
        return None
    low, high = reported
    nearest = low if value < low else high if value > high else value
    return value / nearest if nearest else None


Replay = Callable[[str, list[str], str], ReplaySummary]
"""``replay(scenario, overrides, remediation)``: the composition root's replay (``remediation`` is a
``--remediation`` value; this layer cannot attach remediation itself)."""


def check(fact: ReportFact, replay: Replay) -> FactCheck:
    """Replay ``fact``'s configuration and set the model's outcome and number beside the report's."""
    summary = replay(fact.scenario, list(fact.overrides), fact.remediation)
    value = _value(fact.metric, summary)
    return FactCheck(fact, _outcome(summary), value, _ratio(value, fact.reported))


def markdown_table(checks: Sequence[FactCheck]) -> str:
    """The table OUTCOMES.md holds: one row per fact, the verdict column first."""
    lines = ["| within 2x | report | fact | scenario, `--set` | model outcome | model value | model / report |",
             "|---|---|---|---|---|---|---|"]
    for c in checks:
        f = c.fact
        sets = " ".join(f.overrides) or "(defaults)"
        if f.remediation != "off":
            sets += f" `--remediation {f.remediation}`"
        value = "" if c.value is None else f"{c.value:,.0f}" if c.value >= 100 else f"{c.value:.1f}"
        ratio = "" if c.ratio is None else f"{c.ratio:.2f}"
        verdict = "yes" if c.holds else "**no**"
        lines.append(f"| {verdict} | {f.report} | {f.fact} | {f.scenario} {sets} | {c.outcome} | {value} | {ratio} |")
    return "\n".join(lines)
