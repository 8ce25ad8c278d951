"""Fault: the disk under the event file turns read-only in the middle of a replay.

A real read-only filesystem, not permission bits (root ignores them): an ext4 image on a loop
device, mounted ``errors=remount-ro``, is turned read-only by the kernel itself while the replay
records to it (``/sys/fs/ext4/<dev>/trigger_fs_error``: the path a failing disk takes; writes then
fail with EROFS). A tmpfs remounted with ``mount -o remount,ro`` cannot stand in: the kernel refuses
that remount (EBUSY) while a file on it is open for writing, and the sink holds its file open for
the whole run. The replay pauses at a known arrival (tests/reliability/paced_replay.py) so the disk
fails mid-run on any machine load.

Needs root with CAP_SYS_ADMIN and loop devices (tests/setup.d/40-readonly-disk.sh installs the
tools); where that is missing the test fails and says why, it does not skip.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvscope.recording import read_file

HERE = Path(__file__).resolve().parent
PACED = HERE / "paced_replay.py"
REPLAY = ["replay", "--scenario", "near-miss"]
PAUSE_AT = 14
"""Arrival batch (of near-miss's 29) where the disk fails: half the run is recorded before."""


class LoopDisk:
    """A small ext4 filesystem on a loop device, mounted for one test."""

    def __init__(self, root: Path) -> None:
        self.image, self.mnt = root / "disk.img", root / "mnt"
        self.dev = ""

    def mount(self) -> None:
        self.mnt.mkdir()
        with open(self.image, "wb") as fh:
            fh.truncate(32 << 20)
        steps = (["mkfs.ext4", "-q", "-F", str(self.image)],
                 ["mount", "-o", "loop,errors=remount-ro", str(self.image), str(self.mnt)])
        for argv in steps:
            try:
                done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
            except FileNotFoundError as e:
                pytest.fail(f"{argv[0]} not found ({e}): run tests/setup.d/40-readonly-disk.sh")
            if done.returncode != 0:
                pytest.fail(f"the read-only disk test needs root with CAP_SYS_ADMIN and a loop device: "
                            f"{' '.join(argv)} failed: {done.stderr.strip()}")
        self.dev = subprocess.run(["findmnt", "-n", "-o", "SOURCE", str(self.mnt)], capture_output=True,
                                  text=True, check=True).stdout.strip()

    def make_read_only(self) -> None:
        """The kernel's own error path: ext4 records an error and remounts read-only."""
        trigger = Path(f"/sys/fs/ext4/{Path(self.dev).name}/trigger_fs_error")
        try:
            trigger.write_text("kvscope fault test\n")
        except OSError as e:
            pytest.fail(f"cannot make the test filesystem fail read-only through {trigger} ({e}); "
                        "the read-only disk test needs a kernel with ext4's sysfs error trigger")
        self.assert_read_only()

    def remount_read_only(self) -> None:
        """An administrator's way: the mount itself turned read-only (``mount -o remount,ro``)."""
        done = subprocess.run(["mount", "-o", "remount,ro", str(self.mnt)], capture_output=True, text=True)
        if done.returncode != 0:
            pytest.fail(f"cannot remount the test filesystem read-only: {done.stderr.strip()}")
        self.assert_read_only()

    def assert_read_only(self) -> None:
        with pytest.raises(OSError) as err:
            (self.mnt / "probe").write_text("x")
        assert err.value.errno == 30, err.value  # EROFS: the filesystem, not a permission

    def unmount(self) -> None:
        if subprocess.run(["umount", str(self.mnt)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(self.mnt)], capture_output=True)


@pytest.fixture
def loop_disk(tmp_path):
    disk = LoopDisk(tmp_path)
    try:
        disk.mount()
        yield disk
    finally:
        disk.unmount()


def _events_in(path: Path) -> int:
    """Events readable in the (possibly still growing) event file or its ``.partial``."""
    kept = path if path.exists() else path.with_name(path.name + ".partial")
    if not kept.exists():
        return 0
    return len(read_file(kept, on_error="keep"))


def _wait_for(what: str, proc: subprocess.Popen, check, timeout_s: float = 180.0):
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the replay ended (exit {proc.returncode}) before {what}: {err[-2000:]}")
        assert time.monotonic() < deadline, f"no {what} within {timeout_s:.0f} s"
        time.sleep(0.05)


def _summary(stdout: str) -> dict:
    d = json.loads(stdout)
    d.pop("wall_seconds")
    return d


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_read_only_disk_mid_replay_drops_counted_engine_unchanged_written_part_readable(
        loop_disk, tmp_path, suffix):
    plain = subprocess.run([sys.executable, "-m", "kvscope", *REPLAY, "--json"], capture_output=True, text=True,
                           timeout=300)
    assert plain.returncode == 0, plain.stderr
    control = tmp_path / "control"
    control.mkdir()
    events = loop_disk.mnt / f"events{suffix}"
    proc = subprocess.Popen([sys.executable, str(PACED), str(control), "--pause", str(PAUSE_AT), "--",
                             *REPLAY, "--events", str(events), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        marker = control / f"paused-{PAUSE_AT}"
        _wait_for("the pause", proc, marker.exists)
        before = json.loads(marker.read_text())["recorded"]
        assert before > 0
        _wait_for(f"{before} events on disk", proc, lambda: _events_in(events) >= before)
        loop_disk.make_read_only()
        (control / f"go-{PAUSE_AT}").touch()
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert "Traceback" not in err, err
    # The engine did exactly what it does without kvscope.
    got = _summary(out)
    rec = got.pop("events")
    assert got == _summary(plain.stdout)
    # kvscope says what it lost: a non-zero exit, one warning line, the counts in --json.
    assert proc.returncode == 1, err
    warnings = [line for line in err.splitlines() if line.startswith("kvscope replay: warning:")]
    assert len(warnings) == 1 and "dropped" in warnings[0], err
    assert rec["sink_errors"] >= 1 and rec["why"]
    assert rec["recorded"] > before
    assert rec["dropped"] == rec["recorded"] - before  # everything after the fault, nothing before it
    # What was written before the fault stays readable, and says it is not complete.
    assert not events.exists() or suffix == ".jsonl"  # a Parquet file is never renamed into place
    kept = events if events.exists() else events.with_name(events.name + ".partial")
    df = read_file(kept, on_error="keep")
    facts = df.attrs["kvscope"]["files"][0]
    assert facts["readable"] and facts["complete"] is False
    assert len(df) == before
    assert (df["kind"] == "request_arrived").sum() > 0
    loop_disk.assert_read_only()  # it stayed read-only: nothing after the fault can have been written


@pytest.mark.parametrize("how", ["remount", "fs_error"])
def test_an_event_file_on_a_read_only_disk_is_refused_before_the_replay_naming_the_filesystem(loop_disk, how):
    """Root passes every permission check, so a refusal there is the filesystem's: the one-line
    error says so instead of "permission denied", and no replay runs. A read-only mount fails the
    access check itself; a filesystem the kernel turned read-only after an error fails the write."""
    (loop_disk.remount_read_only if how == "remount" else loop_disk.make_read_only)()
    events = loop_disk.mnt / "events.parquet"
    done = subprocess.run([sys.executable, "-m", "kvscope", *REPLAY, "--events", str(events), "--json"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and done.stdout == "", (done.returncode, done.stdout[-500:])
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert str(events) in lines[0] and "read-only file system" in lines[0].lower(), lines[0]
    assert "permission" not in lines[0], lines[0]
    assert not events.exists()
