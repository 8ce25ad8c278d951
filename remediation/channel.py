"""Control channel: one mode change reaches every rank and takes effect at the same iteration.

Ranks of one engine (TP ranks of a stage, PP stages) run the same scheduler iterations. A change is
a :class:`ControlRecord` stamped with the iteration at which it applies; each rank's controller
reads the channel once per scheduling pass and applies the record when its own pass reaches that
iteration, so every rank switches on the same iteration. The publisher picks an iteration a few
passes ahead (``lead_passes``) so that every rank reads the record before it gets there; a rank
that reads it late applies it at once and counts it (``Controller.stats().late_changes``).

:class:`FileControlChannel` is one JSON file shared by the ranks (a local or shared filesystem):
reading it costs one ``os.stat`` per pass unless it changed. It is obeyed only while it is owned by
the engine's own user and not writable by group or others, as ssh treats its keys: in a shared folder
(``/tmp``) another local user could otherwise create or replace it and steer the engine.
:class:`LocalControlChannel` is the in-process form (one rank, notebooks and tests).
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True, slots=True)
class ControlRecord:
    """One requested change."""

    seq: int
    """Increases with every record published on the channel (a rank applies each seq once)."""
    mode: str
    policy: str | None = None
    """Policy name to switch to (None: keep the current one)."""
    at_iteration: int = -1
    """Scheduler iteration at which every rank applies it (-1: at the next pass)."""


class ControlRecordError(ValueError):
    """A control record that can never be applied (malformed file, unknown mode or policy, a file
    that is not the engine user's own).

    Args:
        code: one word for the event's reason (``bad_json``, ``missing_seq``, ``unknown_mode`` ...).
        detail: one sentence for the operator.
        seq: the record's seq when it had a readable one.
    """

    def __init__(self, code: str, detail: str, *, seq: int | None = None) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail
        self.seq = seq
        self.version: object = None
        """Which version of the channel's content it is about (a file's stamp): reported once each."""


def record_from_dict(data: object) -> ControlRecord:
    """A :class:`ControlRecord` from a decoded control file. Raises :class:`ControlRecordError`
    naming the field that is missing or of the wrong type (mode and policy names are the
    controller's to check)."""
    if not isinstance(data, dict):
        raise ControlRecordError("not_an_object", f"expected a JSON object, got {type(data).__name__}")
    seq = data.get("seq")
    if "seq" not in data:
        raise ControlRecordError("missing_seq", 'no "seq" (each record needs a number above the last one, '
                                 "e.g. {\"seq\": 1, \"mode\": \"on\"})")
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
        raise ControlRecordError("bad_seq", f'"seq" must be an integer >= 1, got {seq!r}')
    mode = data.get("mode")
    if not isinstance(mode, str):
        raise ControlRecordError("missing_mode" if mode is None else "bad_mode",
                                 f'"mode" must be a mode name, got {mode!r}', seq=seq)
    policy = data.get("policy")
    if policy is not None and not isinstance(policy, str):
        raise ControlRecordError("bad_policy", f'"policy" must be a policy name, got {policy!r}', seq=seq)
    at = data.get("at_iteration", -1)
    if isinstance(at, bool) or not isinstance(at, int):
        raise ControlRecordError("bad_at_iteration", f'"at_iteration" must be an integer, got {at!r}', seq=seq)
    # Names in any case, as `kvscope remediation set` takes them (a hand-written "On" is "on"); the
    # trigger a controller appends to an auto record is kept as written.
    base, sep, trigger = mode.partition("+triggered:")
    return ControlRecord(seq, base.strip().lower() + sep + trigger, None if policy is None else policy.strip().lower(), at)


class ControlChannel(Protocol):
    def publish(self, record: ControlRecord) -> None: ...

    def poll(self) -> ControlRecord | None:
        """The latest record (None: nothing published). Cheap: called once per pass."""
        ...


class LocalControlChannel:
    """In-process channel (a single rank)."""

    def __init__(self) -> None:
        self._record: ControlRecord | None = None

    def publish(self, record: ControlRecord) -> None:
        self._record = record

    def poll(self) -> ControlRecord | None:
        return self._record


class FileControlChannel:
    """A JSON file every rank reads (written atomically: temp file + rename).

    A file that does not decode is taken for one being written in place (torn) and read again at the
    next pass, quietly, until it has stayed unchanged for ``settle_s``: then it is broken, and
    :meth:`poll` raises :class:`ControlRecordError` until it changes. A decoded file that is not a
    record (no ``seq``, a field of the wrong type) raises at once: a torn JSON object never decodes.

    A file owned by another user, or writable by group or others, is refused the same way (code
    ``not_owner`` / ``writable_by_others``) and never read: whoever could write it is not trusted to
    steer the engine. :meth:`publish` writes it owned by this process's user, mode 0600.

    Args:
        path: the control file (created on first publish; its directory must exist).
        settle_s: how long an undecodable file may stay unchanged before it is reported.
        euid: the user the file must belong to (default: this process's effective user).
    """

    def __init__(self, path: str | os.PathLike[str], *, settle_s: float = 1.0,
                 euid: Callable[[], int] = os.geteuid) -> None:
        self.path = Path(path)
        self.settle_s = settle_s
        self._euid = euid
        self._stamp: tuple[int, int, int] | None = None
        self._record: ControlRecord | None = None
        self._error: ControlRecordError | None = None

    def publish(self, record: ControlRecord) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".kvscope-control-")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(asdict(record), f)
            os.replace(tmp, self.path)
        except BaseException:
            # The folder is shared by every rank and publisher: a failed publish (the path is a
            # folder, a full disk) must not leave a temp file there at each attempt.
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def poll(self) -> ControlRecord | None:
        """The latest good record (None: nothing published yet).

        Raises:
            ControlRecordError: while the file holds a version that can never be applied (the same
                error, ``version`` = the file's stamp, at every poll until the file changes).
        """
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return self._record
        untrusted = self._untrusted(st)
        if untrusted is not None:
            raise untrusted
        stamp = (st.st_mtime_ns, st.st_ino, st.st_size)
        if stamp == self._stamp:
            if self._error is not None:
                raise self._error.with_traceback(None)
            return self._record
        try:
            text = self.path.read_text()
        except (OSError, UnicodeDecodeError):
            return self._record  # being replaced, or mid-write: read again next pass
        if not text.strip():
            return self._record  # truncated by a writer about to write it: nothing published
        try:
            data = json.loads(text)
        except ValueError as e:
            if time.time_ns() - st.st_mtime_ns < self.settle_s * 1e9:
                return self._record  # a torn write, most likely: read again next pass
            self._stamp, self._error = stamp, ControlRecordError("bad_json", f"not valid JSON ({e})")
            self._error.version = stamp
            raise self._error.with_traceback(None) from None
        self._stamp = stamp
        try:
            self._record, self._error = record_from_dict(data), None
        except ControlRecordError as e:
            e.version = stamp
            self._error = e
            raise
        return self._record

    def _untrusted(self, st: os.stat_result) -> ControlRecordError | None:
        """Why a file with this stat may not steer the engine (None: it may). Its version is the
        file's owner and mode as well as its stamp: a chmod or chown is a new version."""
        euid = self._euid()
        if st.st_uid != euid:
            error = ControlRecordError(
                "not_owner", f"owned by uid {st.st_uid}, not by this engine's user (uid {euid}); a control "
                "file must be the engine user's own and writable by it alone (as ssh requires of its keys)")
        elif st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            error = ControlRecordError(
                "writable_by_others", f"writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}); "
                f"a control file must be writable by the engine's user alone (chmod go-w {self.path}, "
                "as ssh requires of its keys)")
        else:
            return None
        error.version = ("untrusted", st.st_uid, st.st_mode, st.st_mtime_ns, st.st_ino, st.st_size)
        return error

    def next_seq(self) -> int:
        """The seq for the next record: one above the file's (or above a broken file's own seq)."""
        try:
            current = self.poll()
        except ControlRecordError as e:
            if e.seq is not None:
                return e.seq + 1
            # Unreadable: the seq the ranks last applied is lost with it. Seconds since the epoch are
            # above any seq counted from 1, so the record is not taken for an old one.
            return max(int(time.time()), (self._record.seq + 1) if self._record is not None else 1)
        return (current.seq + 1) if current is not None else 1
