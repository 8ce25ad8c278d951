"""Fault: the collector dies part-way through a file export (``kvscope export EVENTS``).

The collector is the real one of the test OTel stack (rotel, collector only, as in
test_faults_otel.py). What was delivered before it died and what was dropped after are both
counted: a partial drop is a warning and exit 1, never the "nothing exported" error (exit 2) of a
collector that took nothing.
"""

from __future__ import annotations

import functools
import json

from kvscope.app import file_export
from kvscope.cli import main
from kvscope.commands import export


def test_a_collector_that_dies_mid_export_is_a_warning_and_exit_1_not_the_nothing_exported_error(
        tmp_path, collector, monkeypatch, capsys):
    import time

    events = tmp_path / "near-miss.parquet"
    assert main(["replay", "--scenario", "near-miss", "--events", str(events), "--json"]) == 0
    capsys.readouterr()

    def kill_after_first_batch(num_events: int) -> None:
        if "rotel" in collector.procs:
            time.sleep(1.0)  # the first batch's spans, logs and metric points reach the collector
            collector.kill_collector()

    monkeypatch.setattr(file_export, "BATCH_ROWS", 200)  # several batches from a small recording
    monkeypatch.setattr(export, "export_files",
                        functools.partial(file_export.export_files, on_progress=kill_after_first_batch))
    code = main(["export", str(events), "--otlp-endpoint", collector.http_endpoint, "--protocol", "http/protobuf",
                 "--timeout", "0.5", "--json"])
    out, err = capsys.readouterr()
    s = json.loads(out)
    assert s["exported_total"] > 0 and s["dropped_total"] > 0, s
    assert code == 1 and "error" not in s
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"kvscope export: warning: {s['dropped_total']} item(s) dropped")
    assert "retrying in" not in lines[0]
