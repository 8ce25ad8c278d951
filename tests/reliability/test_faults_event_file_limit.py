"""Fault: the event file stops growing mid-replay; what the user is told names the file on disk.

A real failing write (not a mock, and one that stops root too): the replay runs under
``RLIMIT_FSIZE`` with SIGXFSZ ignored, so the event file's writes fail with EFBIG once it reaches
the limit, as on a full disk. A Parquet recording that cannot close stays its ``.partial`` stream:
the replay's warning names that file, and ``analyze`` of the final name points to it.
"""

from __future__ import annotations

import json
import resource
import signal
import subprocess
import sys

import pytest

LIMIT_BYTES = 16 << 10
"""Far below near-miss's event file (about 20 KB as Parquet, far more as JSON Lines)."""


def _small_files_only():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails instead of killing
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT_BYTES, LIMIT_BYTES))


def _kvscope(cwd, *args, limited=False):
    return subprocess.run([sys.executable, "-m", "kvscope", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, preexec_fn=_small_files_only if limited else None)


@pytest.mark.parametrize("name, kept", [("x.parquet", "x.parquet.partial"), ("x.jsonl", "x.jsonl")])
def test_write_failure_warning_names_the_file_that_was_kept(tmp_path, name, kept):
    got = _kvscope(tmp_path, "replay", "--scenario", "near-miss", "--events", name, "--json", limited=True)
    assert got.returncode == 1, got.stderr
    assert json.loads(got.stdout)["events"]["sink_errors"] >= 1
    warnings = [line for line in got.stderr.splitlines() if line.startswith("kvscope replay: warning:")]
    assert len(warnings) == 1, got.stderr
    assert warnings[0].startswith(f"kvscope replay: warning: event file {kept}: ")
    assert warnings[0].endswith("; what was written before stays readable")
    assert sorted(p.name for p in tmp_path.iterdir()) == [kept]
    # What the warning names is there and reads as what it is: a recording that did not finish.
    read = _kvscope(tmp_path, "analyze", kept, "--json")
    assert read.returncode == 1, read.stderr
    assert json.loads(read.stdout)["input"]["complete"] is False


def test_analyze_of_the_final_name_points_to_the_partial_left_by_a_failed_recording(tmp_path):
    got = _kvscope(tmp_path, "replay", "--scenario", "near-miss", "--events", "x.parquet", "--json", limited=True)
    assert got.returncode == 1, got.stderr
    read = _kvscope(tmp_path, "analyze", "x.parquet")
    assert read.returncode == 2 and read.stdout == ""
    assert read.stderr.splitlines() == ["kvscope analyze: error: x.parquet: no such event file; x.parquet.partial "
                                        "is beside it (an unfinished recording): give that file instead"]
