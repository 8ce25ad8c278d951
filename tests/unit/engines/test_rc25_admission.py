"""Admission as kvscope sees it on 1.3.0rc25, whose scheduler has neither ``_prepare_context_pair``
nor ``_try_allocate_context`` (it calls the target's ``prepare_context`` and ``resize_context``
directly; ``kvscope/engines/trtllm/seams.py``).

The engine model at rc25 makes the same manager calls without those two seam-named methods, so the
binding meets what it meets on a real rc25 engine: an admission is seen in the pass's output (the
request's first scheduled chunk) and a first-chunk attempt's hold opens at the target's
``prepare_context``. Without that every rc25 recording lacked ADMITTED and repeated a retried
attempt's prefix hit. The same replay on 00746ef (where both seams run) is the control. (Against
the real rc25 ``scheduler_v2.py`` in ``../shared/tools/real-scheduler`` the recordings are the same
row for row: see ``kvscope/engines/trtllm/seams.py``.)
"""

from __future__ import annotations

import pytest

from kvscope.app.session import instrument_replay
from kvscope.events import EventKind
from kvscope.recording import read_frame
from kvscope.replay import run

SEAMS = ("_prepare_context_pair", "_try_allocate_context")


class SeamCalls:
    """Counts the scheduler's calls of the two seams (instance attributes in front of the class's,
    wrapped or not), then starts the event file session."""

    def __init__(self, session):
        self.session = session
        self.calls = dict.fromkeys(SEAMS, 0)

    def __call__(self, parts):
        scheduler = parts.scheduler
        for name in SEAMS:
            method = getattr(scheduler, name)

            def counted(*args, _name=name, _method=method, **kwargs):
                self.calls[_name] += 1
                return _method(*args, **kwargs)

            setattr(scheduler, name, counted)
        return self.session(parts)


def _replay(tmp_path, version):
    path = tmp_path / f"{version}.jsonl"
    seams = SeamCalls(instrument_replay(str(path), label="near-miss"))
    summary = run("near-miss", [f"engine_version={version}"], instrument=seams).to_dict()
    return summary, seams.calls, read_frame(path)


def _story(frame):
    """Per request: iteration of its ADMITTED events, of its first scheduled chunk, its target prefix
    hits (tokens), and the iterations it was deferred in."""
    def by_request(kind, pool=None, col="iteration"):
        f = frame[frame["kind"] == kind.value]
        if pool is not None:
            f = f[f["pool"] == pool]
        return f.groupby("request_id")[col].apply(list).to_dict()

    return (by_request(EventKind.ADMITTED), by_request(EventKind.CONTEXT_CHUNK_SCHEDULED),
            by_request(EventKind.BLOCKS_REUSED, "target", "num_tokens"), by_request(EventKind.ADMISSION_DEFERRED))


@pytest.mark.parametrize("version", ["1.3.0rc25", "main-00746ef"])
def test_every_admission_is_recorded_once_at_its_first_chunk_whether_or_not_the_build_has_the_admission_seams(
        tmp_path, version):
    summary, calls, frame = _replay(tmp_path, version)
    if version == "1.3.0rc25":
        assert calls == dict.fromkeys(SEAMS, 0)  # as the real rc25 scheduler: the seams are never called
    else:
        assert min(calls.values()) > 0
    admitted, chunks, reused, deferred = _story(frame)
    admitted_at = frame[frame["kind"] == EventKind.ADMITTED.value].set_index("request_id")["num_tokens"].to_dict()
    assert summary["requests_completed"] > 0 and len(admitted) >= summary["requests_completed"]
    assert set(admitted) == set(chunks)  # every request with a scheduled chunk was admitted
    for rid, its in admitted.items():
        assert its == [chunks[rid][0]]  # once, in the pass that scheduled its first chunk
    assert reused and all(len(hits) == 1 for hits in reused.values())  # one prefix hit per admission
    # ... and none lost: every request admitted with a reused prefix has its hit on record, with the
    # tokens it was admitted at (rc25 keeps a failed first attempt's caches, so the hit of a request
    # that waited is the one its first attempt found)
    assert reused == {rid: [tokens] for rid, tokens in admitted_at.items() if tokens > 0}
    assert deferred  # near-miss makes requests wait: the retried attempts are there to be held back

