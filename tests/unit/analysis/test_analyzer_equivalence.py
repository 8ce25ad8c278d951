"""The column-based analyzer gives exactly the findings of the pandas-frame analyzer it replaced.

``data/<replay>.parquet`` are event files written by ``kvscope replay --events`` (glm5-dsa with
``max_requests=64``, qwen-hybrid-mtp, shared-prefix, oversize; engine model at commit f705fb5;
``qwen-hybrid-mtp-mamba``: the same scenario recorded at commit cc26c89, with its mamba pool and a
time-to-exhaustion episode whose rates are undefined) and ``data/<replay>.findings.json`` is
``analyze(load_events(path)).to_dict()`` computed on those files by the analyzer at commit f705fb5,
before the column view (kvscope/analysis/columns.py) existed, then regenerated once for one deliberate
change: a time-to-exhaustion estimate is taken at the episode's first iteration with a defined
consumption rate (new evidence key ``estimated_at_iteration``, summary wording). The diff of that
regeneration was checked to touch only time-to-exhaustion summaries and estimate fields, and only
the estimate values of the one episode that opens on a stream's first iteration
(``qwen-hybrid-mtp-mamba``). Regenerated once more for the incident view: findings ordered by
severity then time, new top-level keys ``counts`` and ``verdict``, a new pool config column
``num_host_blocks``, and the engine_fatal summary carrying the engine's whole message (it was cut
at 160 characters); the diff was checked to change nothing else (same kinds, severities, times,
iterations and evidence of every finding). The same regeneration carries the at-risk projections
of the head of the queue and of one more request like the recent ones (time-to-exhaustion episodes
only: their severity, extent and estimate evidence). Regenerated for additive keys only: the pool
config columns ``admits_mirror`` and ``resumes_before_budget`` (-1: these files predate them, so the
rules read them as before), the finding kind ``remediation_deferral`` in ``counts`` (0 here) and the
time-to-exhaustion evidence ``resume_ceiling`` / ``past_ceiling_blocks`` (False / None here); no
finding changed. ``glm5-dsa-reuse-off`` and ``glm5-dsa-rc27-reuse-off`` (see test_resume_ceiling.py)
carry the build facts; their expected findings were written by the analyzer that reads them.
Regenerated for one more additive key: the finding kind ``engine_stalled`` in ``counts`` (0 in every
file; checked: removing it gives the previous objects exactly). Regenerated for the episode's end:
the verdict's new ``open_alarm``, the time-to-exhaustion evidence keys ``end_basis``,
``end_utilization``, ``end_available_blocks`` and ``peak_utilization``, and time-to-exhaustion
summaries (they now close with the episode's end when it outlived its first estimate, and say the
target has room only where it had); checked: dropping those gives the previous objects exactly.
Regenerated for the lead's timing: a time-to-exhaustion episode evaluated at the failure's own
iteration (it read the state the failure left) is no longer credited as the first critical finding;
only ``qwen-hybrid-mtp``'s ``verdict.first_critical`` changed (to the admission gap read at that
iteration's scheduling, lead 0 either way). Regenerated for naming by iteration: a time-to-exhaustion
episode names the requests queued or in prefill during its iterations (the streaming analyzer's
view); by time, a chunk scheduled in the next iteration with the previous iteration's last timestamp
looked finished. Only ``glm5-dsa``'s episode changed: it now also names requests 2 and 3, in
prefill when it opened (``request_ids`` and ``named_at``). Regenerated for wording only: an estimate
timed at the gross allocation rate says "if nothing frees" (checked: removing the phrase gives the
previous objects exactly). Regenerated for the alarm open at a failure: the engine_fatal evidence
``open_alarm`` and its summary's close ("; the draft pool had a ... open from N iterations
earlier" when that came before the request was named), and the verdict's ``open_alarm`` severity as
it was before the failure (``qwen-hybrid-mtp``: warning; its episode turned critical in the failure's
own iteration); checked: nothing else changed. Regenerated for one additive key: time-to-exhaustion
evidence ``num_requests`` (requests queued or in prefill during the episode, named or over the cap).
Regenerated for unknowns shown as unknown: the engine_fatal ``pool_state`` says null where the event
file recorded -1 ("not recorded"), and its summary drops "(asked 0 tokens)" for a refused resume
(it asks no capacity); patched in place: nothing else in these objects changed. Patched in place for
the time-to-exhaustion evidence: ``projected_debt_blocks`` is the projection the opening summary
quotes (the largest of the three; the streaming analyzer's value), and the new ``peak_debt_blocks``
is the most the pool owed during the episode. Patched in place for an alarm that turned critical
after it opened: ``open_alarm`` (verdict and engine_fatal evidence) gains ``critical_lead_iterations``
/ ``critical_lead_s``, and the engine_fatal summary says "warning open from N iterations earlier,
critical from M" where it said "critical open from N" (``glm5-dsa``: 158 / 33;
``qwen-hybrid-mtp-mamba``: 80 / 40); checked: dropping the two keys and those two summaries gives the
previous objects exactly. Patched in place for one additive pair: admission_gap evidence
``critical_at_iteration`` / ``critical_at_s`` (when the gap's debt first went past what finishing
requests cover; every gap in these files is critical from its start, so both equal its start).
Patched in place for one additive key: time-to-exhaustion evidence ``ceiling_closing`` (the pass
hazard with the pool's drift reaching the resume ceiling within the rate window; False in every
file: none of these episodes has the pass basis); checked: dropping it gives the previous objects
exactly.
Patched in place for one wording addition: a time-to-exhaustion summary whose episode opened as a
warning and turned critical later gains, after its opening sentence, "Critical from iteration N at
P% used (<the rule that made it critical>)." (four episodes here, and the verdict and open-alarm
copies of their summaries); checked: removing that one sentence gives the previous objects exactly,
N is the episode's ``critical_at_iteration``, and nothing else differs.
Patched in place for one wording addition: a resume-ceiling reading says what it counted as freed,
", counting F blocks freed over the S iterations the queue takes to come in" after "(95% of
capacity)" (``glm5-dsa-reuse-off`` only: F is 0 in every reading, nothing having finished yet);
checked: removing that clause gives the previous objects exactly.
Patched in place for one new rule, resume near misses (kvscope/analysis/near_miss.py): the kind
``resume_near_miss`` in ``counts`` (0 in six files) and, in ``glm5-dsa-rc27-reuse-off``, its one
finding (a new mirror resumed 123 blocks under the ceiling at iteration 365), which makes that
healthy run's ``by_severity`` warning count 1 and its verdict ``num_findings`` 2 with
``worst_severity`` warning; checked: dropping that finding and those keys gives the previous
objects exactly.
Patched in place for one lead, not two: the verdict's ``first_critical`` of a finding that turned
critical after it opened is timed at the finding's ``critical_at_s`` (when it was evaluated
critical, the time ``open_alarm.critical_lead_s`` is measured from), no longer at the start of that
iteration; only ``t_s`` and ``lead_s`` of ``verdict.first_critical`` in ``glm5-dsa`` and
``shared-prefix`` changed (same iteration); checked: nothing else differs.
Patched in place for one additive key: ``engine_version``, the build the file's header names
(``model-of-main-00746ef`` in five files, ``model-of-1.3.0rc25`` / ``model-of-1.3.0rc27`` in the two
reuse-off files); checked: dropping it gives the previous objects exactly.
Every path into the analyzer must reproduce those objects exactly: the Parquet column view
(``analyze_files``), the fast frame loader, the validating reader and an in-memory frame.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvscope.analysis import analyze, analyze_files, load_events
from kvscope.analysis.loader import read_columns
from kvscope.recording import read_frame

DATA = Path(__file__).parent / "data"
REPLAYS = ["glm5-dsa", "qwen-hybrid-mtp", "shared-prefix", "oversize", "qwen-hybrid-mtp-mamba",
           "glm5-dsa-reuse-off", "glm5-dsa-rc27-reuse-off"]


def _before(name: str) -> dict:
    return json.loads((DATA / f"{name}.findings.json").read_text(encoding="utf-8"))


def _roundtrip(d: dict) -> dict:
    return json.loads(json.dumps(d))


@pytest.mark.parametrize("name", REPLAYS)
def test_findings_identical_to_pre_column_analyzer_when_read_as_columns(name):
    path = DATA / f"{name}.parquet"
    assert read_columns(path) is not None  # the fast column path is the one under test
    assert _roundtrip(analyze_files(path).to_dict()) == _before(name)


@pytest.mark.parametrize("name", REPLAYS)
def test_findings_identical_to_pre_column_analyzer_when_given_a_frame(name):
    path = DATA / f"{name}.parquet"
    before = _before(name)
    assert _roundtrip(analyze(load_events(path)).to_dict()) == before
    assert _roundtrip(analyze(read_frame(path)).to_dict()) == before


def test_replays_cover_every_detector_that_fires_on_them():
    kinds = {f["kind"] for name in REPLAYS for f in _before(name)["findings"]}
    assert kinds == {"admission_gap", "time_to_exhaustion", "reuse_loss", "engine_fatal", "never_fitting",
                     "stalled_reservation", "resume_near_miss"}
    bases = {f["evidence"]["basis"] for name in REPLAYS for f in _before(name)["findings"]
             if f["kind"] == "time_to_exhaustion"}
    assert "resume" in bases


def test_column_view_falls_back_when_file_is_not_parquet(tmp_path):
    bad = tmp_path / "x.parquet"
    bad.write_bytes(b"not parquet")
    assert read_columns(bad) is None
    assert read_columns(tmp_path / "missing.parquet") is None
    assert read_columns(DATA / "glm5-dsa.findings.json") is None


@pytest.mark.parametrize("name", ["glm5-dsa", "oversize"])
def test_findings_identical_when_file_has_many_row_groups(tmp_path, name):
    # Columns read on demand (reason, num_requests, reserved_blocks) fetch only the row groups
    # holding the asked rows: small row groups make those reads partial.
    import pyarrow.parquet as pq

    src = DATA / f"{name}.parquet"
    table = pq.read_table(src)
    path = tmp_path / f"{name}.parquet"
    pq.write_table(table, path, row_group_size=97)
    assert pq.ParquetFile(path).metadata.num_row_groups > 4
    assert pq.ParquetFile(path).schema_arrow.metadata == pq.ParquetFile(src).schema_arrow.metadata
    assert _roundtrip(analyze_files(path).to_dict()) == _before(name)
