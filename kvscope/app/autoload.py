"""In-process start-up of kvscope under ``kvscope-instrument``: the composition root of every process
the launcher starts (worker bootstrap, not a CLI command).

``boot()`` runs in every Python process the launcher starts (through its ``sitecustomize``). It does
nothing visible until the engine's module is imported: a post-import hook then instruments the
engine, opens this process's sinks and starts a pump; an ``atexit`` handler drains and closes them.
A forked child starts over with its own recorder and file (its pid differs). See
:mod:`kvscope.app.launcher` for the environment variables.

As a composition root it imports the exporters (``kvscope.otel``, for the OTLP sink) and, when the
environment asks for them, pool sizing and remediation (:mod:`kvscope.app.sizing`,
:mod:`kvscope.app.remedy`), each only when used.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import wrapt

log = logging.getLogger(__name__)

RANK_VARIABLES = ("KVSCOPE_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "RANK", "SLURM_PROCID")
MODEL_MODULES = ("kvscope.engine_model.executor",)
TRTLLM_MODULES = (
    "tensorrt_llm._torch.pyexecutor.py_executor",
    "tensorrt_llm._torch.pyexecutor.kv_cache.kv_cache_manager_v2",
    "tensorrt_llm._torch.pyexecutor.kv_cache_manager_v2",
)

_lock = threading.Lock()
_state: dict[str, Any] = {"booted": False, "session": None}


def rank_from_env(env: Mapping[str, str]) -> int:
    """The global rank: KVSCOPE_RANK, then the MPI / torch / Slurm variables, else 0."""
    for name in RANK_VARIABLES:
        value = env.get(name)
        if value not in (None, ""):
            try:
                return int(value)
            except ValueError:
                continue
    return 0


class ProcessSession:
    """The recorder, sinks and pump of one instrumented process."""

    def __init__(self, kind: str, env: Mapping[str, str]) -> None:
        from kvscope.engines.instrumentor import instrument
        from kvscope.recording import BatchPump, Recorder

        self.kind = kind
        self.rank = rank_from_env(env)
        self.pid = os.getpid()
        self.recorder = Recorder(rank=self.rank)
        self.binding = instrument(recorder=self.recorder, engine=kind)
        # Absolute from the start: the file sinks open on the first batch, and an engine may change
        # its working directory before; the live stream names the file by this path too.
        out_dir = Path(env.get("KVSCOPE_OUTPUT_DIR", "kvscope-events")).absolute()
        meta = {
            "engine": "engine_model" if kind == "model" else "tensorrt_llm",
            "engine_version": _engine_version(kind),
            "rank": self.rank,
            "pid": self.pid,
            "run_id": env.get("KVSCOPE_RUN_ID") or _own_run_id(),
            "argv": list(sys.argv),
            "pools": self.binding.pool_meta,  # shared: filled as pools are discovered
        }
        pp = env.get("KVSCOPE_PP_SIZE", "").strip()
        if pp.isdigit() and int(pp) > 0:
            # The layout the user declared (labels the export; remediation checks it against the engine's).
            meta["pp_size"] = int(pp)
        self.closers: list = []
        self.sinks = _make_sinks(env, out_dir, self.rank, self.pid, meta, self.closers)
        # For the live stream only (file sinks copied the meta when opened): where a subscriber
        # that joins late reads the events it missed (kvscope.recording.catch_up).
        files = [s.path for s in self.sinks if isinstance(getattr(s, "path", None), Path)]
        if files:
            meta["events_file"] = str(files[0])
        self.pump = BatchPump(self.recorder, self.sinks, interval_s=0.05)
        self._closed = False
        # A SIGTERM would kill the process before the exit handler writes the end record; a Ctrl-C
        # the program catches would leave no trace of it: both are recorded, and SIGTERM unwinds
        # as a KeyboardInterrupt (kvscope.recording.interrupts). A handler of the program's own is
        # kept (called after the signal is recorded); from a thread other than the main one
        # nothing can be installed, and only an uncaught interrupt is seen.
        from kvscope.recording import interrupts

        self.signals_at_start = len(interrupts.received())
        self._handlers_replaced = interrupts.install()
        self.remediation = None
        """The remediation controller attached from ``KVSCOPE_REMEDIATION`` / ``..._CHANNEL`` (or None)."""
        self.sizing = None
        """The budget-split plan from ``KVSCOPE_SIZING`` (or None: the stock split)."""
        if env.get("KVSCOPE_SIZING"):
            try:
                from kvscope.app.sizing import sizing_from_env

                self.sizing = sizing_from_env(self.binding, env)
            except Exception as e:  # noqa: BLE001 - a bad value never stops the engine from starting
                self._not_applied("KVSCOPE_SIZING", e, "the engine splits its KV budget as stock", env)
        if env.get("KVSCOPE_REMEDIATION") or env.get("KVSCOPE_REMEDIATION_CHANNEL"):
            try:
                from kvscope.app.remedy import attach_from_env

                self.remediation = attach_from_env(self.binding, env, real_engine=kind != "model")
                # The state in force goes with every batch of the live stream (the publisher reads
                # the meta at each batch), for a subscriber that joins after the change's event.
                if self.remediation is not None:
                    self.remediation.on_mode_change = lambda reason: meta.__setitem__("remediation", reason)
            except Exception as e:  # noqa: BLE001
                # A bad value must not stop the engine from starting: it runs as stock, and says so
                # in one line (kvscope-instrument refuses such values before the command runs; this
                # is a process given them some other way, e.g. by an MPI or Ray environment).
                self._not_applied("KVSCOPE_REMEDIATION", e, "the engine runs without remediation", env)

    def _not_applied(self, variable: str, error: Exception, outcome: str, env: Mapping[str, str]) -> None:
        """One stderr line: ``variable`` was not applied, why, and what the engine does instead
        (the traceback only with ``KVSCOPE_DEBUG=1``)."""
        why = str(error) if isinstance(error, ValueError) else f"{type(error).__name__}: {error}"
        print(f"kvscope-instrument: rank {self.rank} pid {self.pid}: {variable} not applied: {why}; {outcome}",
              file=sys.stderr)
        if env.get("KVSCOPE_DEBUG"):
            log.error("kvscope: %s not applied", variable, exc_info=error)

    def end_status(self) -> str:
        """How this process's recording ends, at exit: ``interrupted`` when a SIGINT or SIGTERM
        arrived while it recorded (the program may have caught the ``KeyboardInterrupt`` and
        returned normally, as the kvscope CLI does: exit 130 or 143) or an interrupt went uncaught;
        ``error`` after an uncaught exception; else ``complete``."""
        from kvscope.recording import interrupts

        if len(interrupts.received()) > self.signals_at_start:
            return "interrupted"
        # At exit after an uncaught exception the interpreter has set sys.last_value.
        return interrupts.end_status(getattr(sys, "last_value", None))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.pump.shutdown(status=self.end_status())
        for name, report in self.pump.sink_reports.items():
            if report.get("dropped"):
                detail = ", ".join(f"{k} {v}" for k, v in report.items())
                print(f"kvscope-instrument: rank {self.rank} pid {self.pid}: sink {name} dropped "
                      f"{report['dropped']} item(s) ({detail}); the engine ran unaffected", file=sys.stderr)
        for close in self.closers:
            try:
                close()
            except Exception:
                log.exception("kvscope: an exporter failed to shut down")
        from kvscope.engines.instrumentor import uninstrument

        uninstrument(self.kind)
        from kvscope.recording import interrupts

        try:
            interrupts.restore(self._handlers_replaced)
        except (ValueError, OSError):
            pass  # not the main thread: the handlers stay until the process ends

    def end_as_terminated(self) -> None:
        """At exit, after :meth:`close`: after an uncaught :class:`Terminated`, end the process as
        the SIGTERM would have (killed by it: 143 to a shell) instead of as an uncaught Ctrl-C,
        which the interpreter turns into a death by SIGINT (130). Exit handlers registered before
        this session's are skipped, as the SIGTERM's default action would have skipped them all."""
        import signal

        from kvscope.recording import interrupts

        if isinstance(getattr(sys, "last_value", None), interrupts.Terminated) and os.getpid() == self.pid:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except (OSError, ValueError, AttributeError):
                    pass
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)


def _own_run_id() -> str:
    from kvscope.recording import new_run_id

    return new_run_id()


def _engine_version(kind: str) -> str:
    if kind == "model":
        return "model"  # which build it models is in the engine's config, not known at process start
    from kvscope.engines.trtllm.classes import installed_version

    return installed_version() or "unknown"


def _make_sinks(env: Mapping[str, str], out_dir: Path, rank: int, pid: int, meta: dict,
                closers: list | None = None) -> list:
    """Sinks named by KVSCOPE_SINKS; exporters that need a shutdown after the pump go to ``closers``.

    Each sink is opened on its own: one that cannot open (a live port already taken by another
    process, a collector library missing) is reported on one stderr line and in the file header
    (``meta.sinks_failed``) and the others record as if it had not been asked for.
    """
    names = [s.strip() for s in env.get("KVSCOPE_SINKS", "jsonl").split(",") if s.strip()]
    sinks: list = []
    failed: dict[str, str] = {}
    for name in names:
        opener = _SINK_OPENERS.get(name)
        if opener is None:
            failed[name] = "unknown sink name"
            print(f"kvscope-instrument: unknown sink {name!r} in KVSCOPE_SINKS; ignored", file=sys.stderr)
            continue
        try:
            sinks.append(opener(env, out_dir, rank, pid, meta, closers))
        except Exception as e:  # noqa: BLE001 - one sink's failure never takes the others down
            failed[name] = f"{type(e).__name__}: {e}"
            others = ", ".join(n for n in names if n != name) or "none"
            print(f"kvscope-instrument: sink {name} unavailable in pid {pid} ({failed[name]}); "
                  f"recording continues in: {others}", file=sys.stderr)
    if failed:
        meta["sinks_failed"] = failed
        for sink in sinks:  # file sinks copied the header meta when opened; their header is not written yet
            if isinstance(getattr(sink, "meta", None), dict):
                sink.meta["sinks_failed"] = failed
    return sinks


def _open_file_sink(ext: str) -> Any:
    def open_sink(env: Mapping[str, str], out_dir: Path, rank: int, pid: int, meta: dict,
                  closers: list | None) -> Any:
        from kvscope.recording import sink_for_path

        return sink_for_path(out_dir / f"events-rank{rank}-pid{pid}.{ext}", meta=meta)

    return open_sink


def _open_zmq(env: Mapping[str, str], out_dir: Path, rank: int, pid: int, meta: dict,
              closers: list | None) -> Any:
    from kvscope.engines.live import DEFAULT_ZMQ_ENDPOINT, ZmqPublisherSink

    base = env.get("KVSCOPE_ZMQ_ENDPOINT", DEFAULT_ZMQ_ENDPOINT)
    head, _, port = base.rpartition(":")
    endpoint = f"{head}:{int(port) + rank}" if port.isdigit() else base
    hwm = env.get("KVSCOPE_ZMQ_HWM")
    return ZmqPublisherSink(endpoint, run_id=meta.get("run_id"), meta=meta, **({"high_water_mark": int(hwm)} if hwm else {}))


def _open_otlp(env: Mapping[str, str], out_dir: Path, rank: int, pid: int, meta: dict,
               closers: list | None) -> Any:
    from kvscope.otel.pipeline import OtlpConfig
    from kvscope.otel.sink import OtelSink, OtlpPipeline, kvscope_resource

    pipeline = OtlpPipeline(OtlpConfig.from_env(), resource=kvscope_resource(meta, rank=rank))
    sink = OtelSink(**pipeline.sink_options())
    # Shut down with the sink, before the files' end records: the providers' last export attempts
    # (a dead collector's) are then in the sink's report there.
    sink.after_shutdown = pipeline.shutdown
    return sink


_SINK_OPENERS = {"jsonl": _open_file_sink("jsonl"), "parquet": _open_file_sink("parquet"),
                 "zmq": _open_zmq, "otlp": _open_otlp}


def _start(kind: str) -> None:
    with _lock:
        if _state["session"] is not None:
            return
        session = ProcessSession(kind, os.environ)
        _state["session"] = session
    atexit.register(session.end_as_terminated)  # exit handlers run last in, first out: after close
    atexit.register(session.close)
    _note_instrumented(kind, os.environ)


def _after_fork_in_child() -> None:
    old = _state.get("session")
    _state["session"] = None
    if old is not None:
        from kvscope.engines.instrumentor import uninstrument

        uninstrument(old.kind)  # the parent's pump thread does not exist here
        _start(old.kind)


def boot(env: Mapping[str, str] | None = None) -> None:
    """Arrange for instrumentation when the engine is imported. Idempotent; never raises into the host."""
    env = os.environ if env is None else env
    if env.get("KVSCOPE_DISABLE") == "1" or _state["booted"]:
        return
    _state["booted"] = True
    engine = env.get("KVSCOPE_ENGINE", "auto")
    if engine in ("auto", "model"):
        for module in MODEL_MODULES:
            wrapt.register_post_import_hook(_hook("model"), module)
    if engine in ("auto", "tensorrt_llm"):
        for module in TRTLLM_MODULES:
            wrapt.register_post_import_hook(_hook("tensorrt_llm"), module)
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_after_fork_in_child)
    if engine in FORCED_ENGINE_MODULES and env.get("KVSCOPE_LAUNCHER_PID") == str(os.getpid()):
        _watch_for_nothing_recorded(engine, env)


FORCED_ENGINE_MODULES = {"tensorrt_llm": "TensorRT-LLM's executor (tensorrt_llm._torch.pyexecutor)",
                         "model": "the engine model (kvscope.engine_model.executor)"}
"""What a process must import to be instrumented when ``--engine`` names the engine."""


def _watch_for_nothing_recorded(engine: str, env: Mapping[str, str]) -> None:
    """In the command ``kvscope-instrument`` replaced itself with (``exec`` keeps its pid): open
    the run's tally, which every process of this host that starts instrumenting appends to
    (:func:`_note_instrumented`), and at exit say in one stderr line when it stayed empty, i.e. when
    the engine ``--engine`` forced was imported by no process, and so nothing was recorded. The
    exit status stays the command's (an exit handler cannot see it)."""
    path = env.get("KVSCOPE_SESSIONS_FILE", "")
    if not path:
        return
    try:
        with open(path, "w", encoding="utf-8"):
            pass  # empty: this run's tally (a file of an earlier process with this pid is truncated)
    except OSError:
        return
    pid = os.getpid()

    def report() -> None:
        if os.getpid() != pid:
            return  # a forked child runs its parent's exit handlers too
        try:
            with open(path, encoding="utf-8") as fh:
                tally = fh.read()
            os.unlink(path)
        except OSError:
            return
        if tally.strip():
            return
        why = f"no process imported {FORCED_ENGINE_MODULES[engine]}"
        if engine == "tensorrt_llm" and not _importable("tensorrt_llm"):
            why = f"tensorrt_llm is not importable in {sys.executable}"
        print(f"kvscope-instrument: no process on this host recorded any event: --engine {engine} but {why}",
              file=sys.stderr)

    atexit.register(report)


def _importable(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _note_instrumented(kind: str, env: Mapping[str, str]) -> None:
    """Add this process to the run's tally when the launched command keeps one (never creates it)."""
    path = env.get("KVSCOPE_SESSIONS_FILE", "")
    if not path:
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    except OSError:
        return
    try:
        os.write(fd, f"{os.getpid()} {kind}\n".encode())
    except OSError:
        pass
    finally:
        os.close(fd)


def _hook(kind: str):
    def on_import(_module: Any) -> None:
        try:
            _start(kind)
        except Exception:
            log.exception("kvscope: could not start instrumentation for %s", kind)
            print(f"kvscope-instrument: could not instrument {kind}; continuing without it", file=sys.stderr)

    return on_import


def current_session() -> ProcessSession | None:
    return _state.get("session")
