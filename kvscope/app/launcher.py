"""``kvscope-instrument <command...>``: run a command with kvscope loaded in every Python process.

In the spirit of ``opentelemetry-instrument``. TensorRT-LLM runs its executor in worker processes
(MPI or Ray) even on one GPU, so patching the user's process is not enough: this puts a
``sitecustomize`` directory first on ``PYTHONPATH`` and replaces itself with the command (``exec``).
Every Python interpreter started below it, workers included, runs :func:`kvscope.app.autoload.boot`,
which instruments the engine as soon as its module is imported and writes that process's events to
its own file.

Configuration is by environment variables (options here only set them):

==========================  ======================================================================
``KVSCOPE_OUTPUT_DIR``      folder for the event files (default ``./kvscope-events``)
``KVSCOPE_SINKS``           comma list of ``jsonl`` (default), ``parquet``, ``zmq``, ``otlp``
``KVSCOPE_ZMQ_ENDPOINT``    live publisher endpoint base (rank r binds port + r; default
                            ``tcp://127.0.0.1:5557``)
``KVSCOPE_ZMQ_HWM``         messages the live publisher queues per subscriber before it drops
                            (and counts) new ones instead of waiting (default 256: messages hold
                            at most 256 KiB, so a stalled subscriber holds at most 64 MiB)
``OTEL_EXPORTER_OTLP_*``    used by the ``otlp`` sink (standard variables)
``KVSCOPE_ENGINE``          ``auto`` (default), ``tensorrt_llm`` or ``model``
``KVSCOPE_RANK``            global rank; else ``OMPI_COMM_WORLD_RANK``, ``PMIX_RANK``, ``PMI_RANK``,
                            ``RANK``, ``SLURM_PROCID``; else 0
``KVSCOPE_DISABLE``         ``1``: load nothing
``KVSCOPE_SIZING``          re-split the KV byte budget at engine start: a draft byte share (``0.09``)
                            or draft tokens per target token (``4x``), as ``kvscope replay --sizing``
``KVSCOPE_REMEDIATION``     attach remediation at engine start: ``MODE[:POLICY]`` or ``POLICY`` (mode
                            ``on``), any case (``kvscope.app.remediation_setting``)
``KVSCOPE_PP_SIZE``         optional: the pipeline stages you run (labels the export). Remediation
                            reads the engine's own ``mapping.pp_size`` and refuses to start, in one
                            log line, when this says otherwise
``KVSCOPE_RUN_ID``          id of this run in every file header (set here once, so the files of
                            all processes of one run are known to belong together)
==========================  ======================================================================

Each process writes ``<dir>/events-rank<R>-pid<P>.<ext>``; rank and pid are on every event, and the
files merge into one timeline with ``kvscope.recording.read_frame([...])``. A Ctrl-C or SIGTERM ends
each file ``interrupted`` (never as an engine failure): SIGTERM, unless the program handles it
itself, unwinds its main thread like a Ctrl-C and the process then dies of SIGTERM as it would have,
after its recording is closed (:mod:`kvscope.recording.interrupts`).

With ``--engine tensorrt_llm`` or ``model`` the command, when it is a Python program, says at its exit
in one stderr line when no process of this host was instrumented (the engine was never imported, or
TensorRT-LLM is not importable): ``exec`` keeps the launcher's pid, so the command is told it is the
one to report (``KVSCOPE_LAUNCHER_PID``) and where the run's processes note that they started
(``KVSCOPE_SESSIONS_FILE``, a temp file it removes). Its exit status stays its own.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from kvscope.app.remediation_setting import parse_remediation_setting
from kvscope.arguments import OneLineParser
from kvscope.engines.live import DEFAULT_ZMQ_ENDPOINT
from remediation.sizing import BudgetSplit

BOOTSTRAP_DIR = Path(__file__).resolve().parent / "_bootstrap"
DEFAULT_OUTPUT_DIR = "kvscope-events"
DEFAULT_SINKS = "jsonl"
SINK_NAMES = ("jsonl", "parquet", "zmq", "otlp")
ENGINES = ("auto", "tensorrt_llm", "model")
FILE_SINKS = ("jsonl", "parquet")


def check_env(env: dict[str, str]) -> list[str]:
    """Problems with the kvscope variables of ``env`` (one line each), found before the command runs.

    The processes below the launcher cannot refuse to start (kvscope never takes a host down), so
    everything that can be checked up front is checked here: sink names, engine, rank, endpoint,
    and that the output folder can be written when a file sink is on.
    """
    problems = []
    sinks = [s.strip() for s in env.get("KVSCOPE_SINKS", "jsonl").split(",") if s.strip()]
    unknown = [s for s in sinks if s not in SINK_NAMES]
    if unknown or not sinks:
        problems.append(f"--sinks/KVSCOPE_SINKS: unknown sink {', '.join(map(repr, unknown or ['']))}; "
                        f"valid: {', '.join(SINK_NAMES)}")
    if env.get("KVSCOPE_ENGINE", "auto") not in ENGINES:
        problems.append(f"--engine/KVSCOPE_ENGINE: {env['KVSCOPE_ENGINE']!r}; valid: {', '.join(ENGINES)}")
    rank = env.get("KVSCOPE_RANK")
    if rank not in (None, "") and not (rank.isdigit() and len(rank) < 10):
        problems.append(f"KVSCOPE_RANK: expected a rank number >= 0, got {rank!r}")
    endpoint = env.get("KVSCOPE_ZMQ_ENDPOINT")
    if endpoint is not None and "zmq" in sinks and "://" not in endpoint:
        problems.append(f"--zmq-endpoint/KVSCOPE_ZMQ_ENDPOINT: expected e.g. tcp://127.0.0.1:5557, got {endpoint!r}")
    hwm = env.get("KVSCOPE_ZMQ_HWM")
    if hwm is not None and not (hwm.isdigit() and 0 < int(hwm) < 1 << 31):
        problems.append(f"KVSCOPE_ZMQ_HWM: expected a number of messages > 0, got {hwm!r}")
    sizing = sizing_problem(env.get("KVSCOPE_SIZING", ""))
    if sizing:
        problems.append(f"KVSCOPE_SIZING: {sizing}")
    remediation = remediation_problem(env)
    if remediation:
        problems.append(remediation)
    if any(s in FILE_SINKS for s in sinks) and env.get("KVSCOPE_DISABLE") != "1":
        why = _unwritable_dir(Path(env.get("KVSCOPE_OUTPUT_DIR", "kvscope-events")))
        if why:
            problems.append(f"--output-dir/KVSCOPE_OUTPUT_DIR: {why}")
    return problems


def sizing_problem(value: str) -> str | None:
    """Why a ``KVSCOPE_SIZING`` value is not a plan an engine can apply at start (None: fine or unset).
    The plan is read by ``remediation.sizing.BudgetSplit.parse``, as every worker reads it; the
    message names the forms for a launcher's user."""
    text = value.strip().lower()
    if not text:
        return None
    try:
        BudgetSplit.parse(text)
    except ValueError:
        return (f"expected a draft byte share in (0, 1) (e.g. 0.09) or a draft token ratio (e.g. 4x), got {value!r}"
                + ("; auto needs a recorded run (kvscope replay --sizing auto --sizing-from EVENTS)"
                   if text == "auto" else ""))
    return None


def remediation_problem(env: Mapping[str, str]) -> str | None:
    """Why ``KVSCOPE_REMEDIATION`` (and the numbers its controller reads) cannot attach at engine
    start, as one line naming the variable (None: fine or unset). The forms are those of
    :func:`kvscope.app.remediation_setting.parse_remediation_setting`, which every worker reads the
    variable with, so the launcher refuses exactly what a worker could not attach."""
    value = env.get("KVSCOPE_REMEDIATION", "")
    try:
        setting = parse_remediation_setting(value)
    except ValueError as e:
        return f"KVSCOPE_REMEDIATION: {e}"
    if not (value.strip() or env.get("KVSCOPE_REMEDIATION_CHANNEL", "").strip()):
        return None
    for name, unit in (("KVSCOPE_MAX_SEQ_LEN", "tokens"), ("KVSCOPE_PP_SIZE", "pipeline ranks")):
        number = env.get(name, "").strip()
        if number and not (number.isdigit() and len(number) < 10):
            return f"{name}: expected a number of {unit}, got {env[name]!r}"
    if value.strip() and setting.policy == "worst-case" and not int(env.get("KVSCOPE_MAX_SEQ_LEN", "").strip() or 0):
        return ("KVSCOPE_REMEDIATION: the worst-case policy needs the engine's max_seq_len: "
                "set KVSCOPE_MAX_SEQ_LEN (tokens)")
    return None


def _unwritable_dir(folder: Path) -> str | None:
    """Why events cannot be written in ``folder`` (created if missing), or None."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{folder}: {existing} is not a folder"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".kvscope-probe-{os.getpid()}"
        with open(probe, "wb"):
            pass
        probe.unlink()
    except OSError as e:
        return f"{folder}: cannot write there: {e.strerror or e}"
    return None


def build_env(base: dict[str, str], *, output_dir: str | None = None, sinks: str | None = None,
              engine: str | None = None, zmq_endpoint: str | None = None) -> dict[str, str]:
    """The environment the command runs in: bootstrap first on PYTHONPATH, kvscope importable."""
    env = dict(base)
    kvscope_root = str(Path(__file__).resolve().parents[2])
    parts = [str(BOOTSTRAP_DIR), kvscope_root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    seen: list[str] = []
    for p in parts:
        if p not in seen:
            seen.append(p)
    env["PYTHONPATH"] = os.pathsep.join(seen)
    env["KVSCOPE_OUTPUT_DIR"] = str(Path(output_dir or env.get("KVSCOPE_OUTPUT_DIR", DEFAULT_OUTPUT_DIR)).resolve())
    if sinks:
        env["KVSCOPE_SINKS"] = sinks
    if engine:
        env["KVSCOPE_ENGINE"] = engine
    if zmq_endpoint:
        env["KVSCOPE_ZMQ_ENDPOINT"] = zmq_endpoint
    if not env.get("KVSCOPE_RUN_ID"):
        import uuid

        env["KVSCOPE_RUN_ID"] = uuid.uuid4().hex[:16]
    return env


def main(argv: Sequence[str] | None = None) -> int:
    parser = OneLineParser(
        prog="kvscope-instrument",
        description="Run COMMAND with kvscope recording KV events in every Python process it starts.")
    parser.add_argument("--output-dir", help=f"event file folder (KVSCOPE_OUTPUT_DIR; default ./{DEFAULT_OUTPUT_DIR})")
    parser.add_argument("--sinks", help=f"comma list of jsonl, parquet, zmq, otlp (KVSCOPE_SINKS; default {DEFAULT_SINKS})")
    parser.add_argument("--engine", choices=ENGINES,
                        help="engine to instrument (KVSCOPE_ENGINE; default auto: TensorRT-LLM when importable)")
    parser.add_argument("--zmq-endpoint", help=f"live publisher endpoint base, rank r binds port + r "
                                               f"(KVSCOPE_ZMQ_ENDPOINT; default {DEFAULT_ZMQ_ENDPOINT})")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command to run")
    args = parser.parse_args(argv)
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print("kvscope-instrument: error: no command given (usage: kvscope-instrument [options] COMMAND ...)",
              file=sys.stderr)
        return 2
    env = build_env(dict(os.environ), output_dir=args.output_dir, sinks=args.sinks, engine=args.engine,
                    zmq_endpoint=args.zmq_endpoint)
    problems = check_env(env)
    if problems:
        print(f"kvscope-instrument: error: {problems[0]}", file=sys.stderr)
        return 2
    exe = shutil.which(command[0], path=env.get("PATH"))
    if exe is None:
        print(f"kvscope-instrument: error: command not found: {command[0]}", file=sys.stderr)
        return 127
    for name in ("KVSCOPE_LAUNCHER_PID", "KVSCOPE_SESSIONS_FILE"):
        env.pop(name, None)  # an outer launcher's
    if env.get("KVSCOPE_ENGINE") in ("tensorrt_llm", "model"):
        # The engine was named: when none of the processes is instrumented, the command (this pid
        # after exec, when it is a Python program) says so at its exit (autoload.boot).
        env["KVSCOPE_LAUNCHER_PID"] = str(os.getpid())
        env["KVSCOPE_SESSIONS_FILE"] = str(Path(tempfile.gettempdir()) / f"kvscope-instrument-{os.getpid()}.sessions")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(exe, command, env)
    return 0  # pragma: no cover - execve does not return


if __name__ == "__main__":
    raise SystemExit(main())
