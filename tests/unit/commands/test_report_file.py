"""``write_text_whole`` (kvscope/commands/_outputs.py): a report replaced whole, where it is meant to go.

The failing-disk half is in tests/reliability/test_faults_report_write.py (a real failed write).
"""

from __future__ import annotations

import os
import stat
import threading

from kvscope.commands._outputs import write_text_whole


def test_report_replaces_the_file_a_symlink_names_and_keeps_the_link(tmp_path):
    (tmp_path / "reports").mkdir()
    real = tmp_path / "reports" / "r1.html"
    real.write_text("old")
    link = tmp_path / "latest.html"
    link.symlink_to(real)
    write_text_whole(link, "new", flag="--html")
    assert link.is_symlink() and real.read_text() == "new"
    assert sorted(p.name for p in (tmp_path / "reports").iterdir()) == ["r1.html"]


def test_report_keeps_the_mode_of_the_report_it_replaces(tmp_path):
    path = tmp_path / "r.html"
    path.write_text("old")
    path.chmod(0o640)
    write_text_whole(path, "new", flag="--html")
    assert path.read_text() == "new" and stat.S_IMODE(path.stat().st_mode) == 0o640


def test_new_report_gets_the_mode_a_plain_open_would(tmp_path):
    umask = os.umask(0o022)
    os.umask(umask)
    (tmp_path / "plain").write_text("x")
    write_text_whole(tmp_path / "r.html", "new", flag="--html")
    assert stat.S_IMODE((tmp_path / "r.html").stat().st_mode) == stat.S_IMODE((tmp_path / "plain").stat().st_mode)


def test_report_to_a_fifo_is_written_into_it_not_renamed_over_it(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()))
    reader.start()
    write_text_whole(fifo, "report text", flag="--html")
    reader.join(timeout=10)
    assert got == ["report text"]
    assert stat.S_ISFIFO(fifo.stat().st_mode)
