"""Output files for commands: a report is written whole or not at all.

A report is written to a temporary file in the same folder and renamed into place
(``os.replace``, atomic within one filesystem), so a full disk, a file-size limit or a kill never
leaves a truncated report that looks whole, and never costs the report that was there before.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import uuid


class OutputNotWritten(ValueError):
    """An output file that could not be written (one line naming the flag and the file)."""


def write_text_whole(path: str | os.PathLike[str], text: str, *, flag: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` whole, or leave ``path`` as it was.

    Through a symlink, the file it names is replaced and the link kept. A path that is not a regular
    file (``/dev/stdout``, a FIFO) is written directly: there is nothing to rename over.

    Args:
        path: the output file, as the user gave it.
        text: the whole content.
        flag: the flag that named ``path`` (``--html``), for the error line.

    Raises:
        OutputNotWritten: the write failed; no temporary file is left behind.
    """
    target = os.path.realpath(path)
    try:
        is_regular = stat.S_ISREG(os.stat(target).st_mode)
    except FileNotFoundError:
        is_regular = True  # a new file
    except OSError as e:
        raise OutputNotWritten(f"cannot write {flag} {path}: {e.strerror or e}; nothing was written there") from None
    if not is_regular:
        try:
            with open(target, "w", encoding="utf-8") as fh:
                fh.write(text)
        except OSError as e:
            raise OutputNotWritten(f"cannot write {flag} {path}: {e.strerror or e}") from None
        return
    folder, name = os.path.split(target)
    tmp = os.path.join(folder, f".{name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        # Mode 0o666 under the umask, as a plain open() would give a new report (mkstemp's 0o600
        # would hide a report in a shared folder from its readers).
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())  # a full disk may only say so here
        if os.path.exists(target):
            shutil.copymode(target, tmp)  # replacing a report keeps who may read it
        os.replace(tmp, target)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError):
            raise OutputNotWritten(
                f"cannot write {flag} {path}: {e.strerror or e}; nothing was written there") from None
        raise


__all__ = ["OutputNotWritten", "write_text_whole"]
