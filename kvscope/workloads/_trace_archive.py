"""Reading members of a one-block ``.tar.xz`` in an arbitrary order without O(archive) per member.

The kv-cache-tester archive is ONE xz block (1.2 MB packed, 461 MB unpacked): it cannot be seeked,
so reading a member behind the current position means decompressing from the start again. Sessions
start in a seeded shuffle of the members, so ``MemberReader`` keeps ONE forward traversal open and
serves members in any order:

- ``names()``: a first traversal lists the members (headers only; about 0.8 s on this machine).
- ``take(name, keep)``: returns the member from the store if it was passed earlier, else advances
  the traversal to it (wrapping round to a new traversal at the end). Members passed on the way for
  which ``keep(name)`` is true (the caller's next few sessions) are kept as read; all others are
  skipped and read again by a later traversal. (Keeping them zlib-compressed would save memory but
  cost more time than a re-traversal: about 3 ms per member against 1 ms to skip it.)

So a session start costs O(its member) plus, now and then, one more traversal; memory holds at most
the members ``keep`` admits (the caller bounds them with a window), never the whole archive, and
nothing is unpacked to disk. Read with ``tarfile`` mode ``"r:xz"`` (a buffered ``lzma`` file that
only ever seeks forward): the stream mode ``"r|xz"`` reads in 10 KiB records and skips members very
slowly.
"""

from __future__ import annotations

import lzma
import tarfile
from collections.abc import Callable, Iterator

from .workload import TraceFormatError

__all__ = ["MemberReader"]

_Entry = tuple[str, Callable[[], bytes]]


class MemberReader:
    """Serves ``*.json`` members of a tar.xz in any order (see module docstring).

    Args:
        path: the archive.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._names: list[str] | None = None
        self._store: dict[str, bytes] = {}
        self._traversal: Iterator[_Entry] | None = None
        self.num_traversals = 0
        """Traversals started (the listing one included)."""

    @property
    def num_stored(self) -> int:
        """Members held for later takes."""
        return len(self._store)

    def names(self) -> list[str]:
        """Sorted member names (regular ``*.json`` files). Lists the archive on first call."""
        if self._names is None:
            names = sorted(name for name, _ in self._traverse())
            if not names:
                raise TraceFormatError(
                    self.path, "archive", "<members>", "holds no *.json session member"
                )
            self._names = names
        return self._names

    def take(self, name: str, keep: Callable[[str], bool]) -> bytes:
        """The bytes of member ``name``; members passed on the way are kept when ``keep(them)``.

        Raises TraceFormatError when the archive cannot be read or no longer holds ``name``.
        """
        stored = self._store.pop(name, None)
        if stored is not None:
            return stored
        wrapped = False
        while True:
            if self._traversal is None:
                self._traversal = self._traverse()
            entry = next(self._traversal, None)
            if entry is None:
                self._traversal = None
                if wrapped:
                    raise TraceFormatError(
                        self.path, f"member {name}", "<archive>", "not found in the archive"
                    )
                wrapped = True
                continue
            member, read = entry
            if member == name:
                return read()
            if member not in self._store and keep(member):
                self._store[member] = read()

    def close(self) -> None:
        """End the open traversal (it holds an open file)."""
        if self._traversal is not None:
            self._traversal.close()  # type: ignore[attr-defined]
            self._traversal = None

    def _traverse(self) -> Iterator[_Entry]:
        """One forward pass: (name, reader) per ``*.json`` member; a reader works until the next."""
        self.num_traversals += 1
        current = "archive"
        try:
            with tarfile.open(self.path, "r:xz") as tf:
                for member in tf:
                    if not member.isfile() or not member.name.endswith(".json"):
                        continue
                    current = f"member {member.name}"
                    yield member.name, _reader(tf, member)
        except FileNotFoundError:
            raise
        except (tarfile.TarError, lzma.LZMAError, EOFError, OSError) as exc:
            raise TraceFormatError(self.path, current, "<archive>", f"cannot read: {exc}") from exc


def _reader(tf: tarfile.TarFile, member: tarfile.TarInfo) -> Callable[[], bytes]:
    def read() -> bytes:
        fh = tf.extractfile(member)
        assert fh is not None  # regular file
        return fh.read()

    return read
