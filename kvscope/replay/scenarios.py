"""Built-in replay scenarios: engine knobs from the public report, and their workloads.

Every number below is a fact from the public incident report; where the report is silent the choice
is named as the model's own.

- ``glm5-dsa``: GLM-5.3 DSA, pp 2 / tp 4, MTP with 1 draft token, block reuse on, chunked prefill,
  max_num_tokens 8192, max_batch_size 64, max_seq_len 262144, tokens_per_block 64; one 60.51 GiB GPU
  budget split at 49,968 B/token (target) and 1,284 B/token (draft): about 1.27M tokens (19,807
  blocks) in each pool. Traffic: the Claude Code agentic traces, closed loop, 16-32 requests in
  flight (model choice: 24), with the tools+system prefix shared across sessions; the first 48
  sessions of the seeded order (~3,100 requests; ``--set max_sessions=0`` replays without end,
  recycling sessions under fresh namespaces). The traces carry no absolute start times. The tool that
  publishes them and replays them against a server (kv-cache-tester's ``trace_replay_tester.py``)
  starts with one user and adds users once per 30 s assessment period, 1 to 7 at a time (+1 for the
  first two ramps, then 1 + TTFT headroom / 15), so a real replay ramps up over minutes; the model
  starts one session every 10 s (``session_start_interval_s`` 10: three users per period, inside that
  range), never all at t=0. ``-1`` starts them one mean request cycle apart (28.67 s / 24 = 1.19 s),
  ``0`` all at t=0; OUTCOMES.md shows how the outcome moves with it. Clients send no ``max_tokens``
  (``client_max_tokens`` none: TensorRT-LLM deduces max_seq_len - prompt).
- ``shared-prefix``: the report's minimal reproduction on the glm5-dsa engine: many 100k+ token
  prompts sharing one long prefix at 16+ concurrency (synthetic).
- ``qwen-hybrid-mtp``: hybrid Gated-DeltaNet/attention 27B, tp 2, MTP with 3 draft tokens, block
  reuse on, chunked prefill, batch 32, 8192 tokens, max_seq_len 131072, target attention pool 35,936
  blocks, draft attention pool 22,848 blocks, tokens_per_block 32 (engine default; the report does not
  state it), 71 mamba state slots, snapshots every 2048 tokens, draft sized from the prompt cursor.
  Traffic: the report's client script (synthetic): 12 clients, each with its own ~80k-token prefix;
  the script warms the prefixes one after another, then sends the ~81k-token follow-ups together, each
  with ``max_tokens`` 32,768 (``client_max_tokens``). Warm-ups one at a time (``warmup_concurrency``
  1) because the report's engine died after its warm-ups (80-107 s), which twelve concurrent 80k
  warm-ups (``warmup_concurrency`` 0) cannot survive: they overfill the 731k-token draft pool alone.
- ``mooncake-conversation``: the Mooncake conversation trace (open loop) on the glm5-dsa engine: a
  healthy replay. The trace is a production cluster's traffic (12,031 requests in 3,537 s, ~12k-token
  prompts: ~41k prompt tokens/s), more than one 8-GPU engine computes (~32k tokens/s, COST_SOURCES.md),
  so arrivals are stretched 2.5x (``arrival_time_scale``) to about half its compute, and the first
  2,000 requests are replayed (``max_requests``). A control must stay healthy on every build: at 2x
  (about 60 %) the KV pools run full and 1.3.0rc25 dies at request 456 (a suspended generation
  mirror's resume after the pass's context mirrors took the draft over 0.95; main-00746ef survives),
  and at full rate the open loop piles up ~60 requests in flight and the unpaired draft pool runs
  out like in the other scenarios (OUTCOMES.md).
- ``near-miss`` / ``oversize``: helpers for the analyzer: shared-prefix traffic that fills the draft
  pool close to, but not past, capacity; and a stream with prompts over max_seq_len (rejected per
  request, engine stays healthy).

Engine knobs come from ``kvscope.engine_model.config``; workloads from ``kvscope.workloads``
(``traces_claude``, ``traces_mooncake``, ``synthetic``), imported when a scenario is built so that
listing the registry loads no trace reader.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvscope.engine_model.config import DraftCursorSizing, EngineConfig

GIB = 1 << 30


def find_traces_dir(root: Path, environ: Mapping[str, str]) -> Path:
    """``KVSCOPE_TRACES_DIR``; else the nearest ``shared/traces`` beside the checkout ``root`` or
    beside one of its parent folders (a clone at ``/work/x/kvscope`` finds ``/work/shared/traces``);
    else ``../shared/traces``, which the not-found errors then name."""
    if environ.get("KVSCOPE_TRACES_DIR"):
        return Path(environ["KVSCOPE_TRACES_DIR"])
    for folder in root.parents:
        if (folder / "shared" / "traces").is_dir():
            return folder / "shared" / "traces"
    return root.parent / "shared" / "traces"


TRACES_DIR = find_traces_dir(Path(__file__).resolve().parents[2], os.environ)
"""Where the built-in scenarios' public traces are (see :func:`find_traces_dir`)."""


def bundled_trace(name: str) -> Path:
    """``TRACES_DIR / name``, or a not-found error that says where traces are looked for."""
    path = TRACES_DIR / name
    if not path.exists():
        raise FileNotFoundError(f"trace not found: {path} (the built-in scenarios read their traces from "
                                f"shared/traces beside the checkout or one of its parent folders; set "
                                f"KVSCOPE_TRACES_DIR to the folder that holds {name})")
    return path


GLM5_DSA = EngineConfig(
    max_batch_size=64, max_num_tokens=8192, max_seq_len=262144, tokens_per_block=64,
    enable_block_reuse=True, enable_chunked_prefill=True, max_draft_len=1, pp_size=2, tp_size=4,
    max_gpu_total_bytes=int(60.51 * GIB), target_bytes_per_token=49968, draft_bytes_per_token=1284,
    requests_in_flight=24, share_system_prefix=True, max_sessions=48, engine_version="1.3.0rc25",
    num_host_blocks=19807, session_start_interval_s=10.0,
)

QWEN_HYBRID_MTP = EngineConfig(
    max_batch_size=32, max_num_tokens=8192, max_seq_len=131072, tokens_per_block=32,
    enable_block_reuse=True, enable_chunked_prefill=True, max_draft_len=3, pp_size=1, tp_size=2,
    max_gpu_total_bytes=0, num_target_blocks=35936, num_draft_blocks=22848,
    num_mamba_slots=71, mamba_snapshot_interval=2048,
    draft_cursor_sizing=DraftCursorSizing.PROMPT, requests_in_flight=12, share_system_prefix=False,
    engine_version="1.3.0rc27", warmup_concurrency=1, client_max_tokens="32768",
    # Its own step costs (a dense 27B hybrid on 2 x H100, TP 2; derivations in COST_SOURCES.md).
    step_overhead_s=0.010, prefill_s_per_token=6.8e-5, decode_s_per_request=2.7e-4, mtp_acceptance_rate=0.80,
)


@dataclass(frozen=True, slots=True)
class Scenario:
    """A named engine configuration and the workload it replays."""

    name: str
    description: str
    config: EngineConfig
    build_workload: Callable[[EngineConfig], Any]
    """Creates a fresh workload (``Workload`` protocol) for the given, possibly overridden, config."""
    shows: str = ""
    """What the replay shows with its defaults (``kvscope replay --list-scenarios``)."""


def _module(name: str) -> Any:
    return importlib.import_module(f"kvscope.workloads.{name}")


def _claude_workload(config: EngineConfig, path: str | Path | None = None) -> Any:
    traces = _module("traces_claude")
    interval = config.session_start_interval_s
    if interval < 0:  # derived: the first sessions arrive at the loop's own pace, not in a burst
        interval = traces.paced_session_start_interval_s(config.requests_in_flight)
    return traces.ClaudeCodeTraceWorkload(
        config.tokens_per_block, config.seed, path=str(path or bundled_trace("kv-cache-tester_traces.tar.xz")),
        requests_in_flight=config.requests_in_flight,
        max_think_time_s=None if config.think_time_cap_s < 0 else config.think_time_cap_s,
        share_system_prefix=config.share_system_prefix, max_requests=config.max_requests or None,
        max_sessions=config.max_sessions or None, session_start_interval_s=interval)


def _mooncake_workload(config: EngineConfig) -> Any:
    return _module("traces_mooncake").create_mooncake_workload(
        bundled_trace("conversation_trace.jsonl"), tokens_per_block=config.tokens_per_block,
        seed=config.seed, time_scale=config.arrival_time_scale, max_requests=config.max_requests or None)


def _synthetic(factory: str, **extra: Any) -> Callable[[EngineConfig], Any]:
    def build(config: EngineConfig) -> Any:
        return getattr(_module("synthetic"), factory)(**_closed_loop_kwargs(config), **extra)

    return build


def _qwen_workload(config: EngineConfig) -> Any:
    return _module("synthetic").create_qwen_followup_workload(
        **_closed_loop_kwargs(config), warmup_concurrency=config.warmup_concurrency)


def _closed_loop_kwargs(config: EngineConfig) -> dict[str, Any]:
    return {
        "tokens_per_block": config.tokens_per_block,
        "requests_in_flight": config.requests_in_flight,
        "max_think_time_s": None if config.think_time_cap_s < 0 else config.think_time_cap_s,
        "max_requests": config.max_requests or None,
        "seed": config.seed,
    }


def trace_workload_builder(path: str | Path) -> Callable[[EngineConfig], Any]:
    """Workload builder for ``--trace PATH``: ``.jsonl`` is Mooncake (open loop), ``.tar.xz`` /
    ``.tar`` is a kv-cache-tester archive (closed loop)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"trace not found: {path}")
    if path.suffix == ".jsonl":
        return lambda config: _module("traces_mooncake").create_mooncake_workload(
            path, tokens_per_block=config.tokens_per_block, seed=config.seed,
            time_scale=config.arrival_time_scale, max_requests=config.max_requests or None)
    if path.name.endswith((".tar.xz", ".tar")):
        return lambda config: _claude_workload(config, path)
    raise ValueError(f"unknown trace format {path.name!r}: expected .jsonl (Mooncake) or .tar.xz (kv-cache-tester)")


SCENARIOS: dict[str, Scenario] = {
    "glm5-dsa": Scenario(
        "glm5-dsa", "GLM-5.3 DSA pp2/tp4 MTP1, Claude Code agentic traces (shared tools+system prefix)",
        GLM5_DSA, _claude_workload,
        "the incident: target reuse keeps the target pool small while every unpaired draft mirror "
        "holds its whole context; the draft pool runs out and the engine dies at a mirror's context "
        "resize (request 192, as the report's 186), at max_batch_size=8 at a suspended mirror's resume; "
        "reuse off survives on every build, draft_mode=paired on main-00746ef."),
    "shared-prefix": Scenario(
        "shared-prefix", "glm5-dsa engine; 100k+ token prompts sharing one long prefix at 16+ concurrency",
        dataclasses.replace(GLM5_DSA, requests_in_flight=24, max_requests=96),
        _synthetic("create_shared_prefix_workload"),
        "the minimal reproduction without agentic traffic: the draft pool fills within seconds of "
        "simulated time and the engine dies; reuse off survives on every build, paired on main-00746ef."),
    "qwen-hybrid-mtp": Scenario(
        "qwen-hybrid-mtp", "hybrid GDN/attention 27B tp2 MTP3; 12 clients warm a long prefix then ~81k follow-ups",
        QWEN_HYBRID_MTP, _qwen_workload,
        "the same failure on a hybrid model with a mamba state pool (three pools): after the warm-ups "
        "the follow-ups' mirrors fill the draft attention pool, smaller than the target's, and the "
        "engine dies at a new mirror's resume (about 71 s; the report: 80-107 s)."),
    "mooncake-conversation": Scenario(
        "mooncake-conversation", "Mooncake conversation trace, open loop, on the glm5-dsa engine (healthy)",
        dataclasses.replace(GLM5_DSA, arrival_time_scale=2.5, max_requests=2000), _mooncake_workload,
        "a healthy control on production traffic at about half the engine's compute: no failure on any build "
        "(draft peak about 86 %); at 2x (about 60 %) 1.3.0rc25 dies at a suspended mirror's resume."),
    "near-miss": Scenario(
        "near-miss", "shared-prefix traffic that fills the draft pool close to, not past, capacity",
        dataclasses.replace(GLM5_DSA, requests_in_flight=16, max_requests=48),
        _synthetic("create_near_miss_workload"),
        "the analyzer's precision: the draft pool peaks near 93 % and the engine survives, so no "
        "admission gap may be raised."),
    "oversize": Scenario(
        "oversize", "prompts over max_seq_len among normal ones: per-request rejections, engine healthy",
        dataclasses.replace(GLM5_DSA, requests_in_flight=4, max_requests=16),
        _synthetic("create_oversize_workload"),
        "per-request rejection (ADMISSION_REJECTED, never-fitting requests) without an engine failure."),
}


def get_scenario(name: str) -> Scenario:
    """The built-in scenario ``name``; ValueError lists the valid names."""
    try:
        return SCENARIOS[name]
    except KeyError:
        raise ValueError(f"unknown scenario {name!r}; built-in scenarios: {', '.join(sorted(SCENARIOS))}") from None
