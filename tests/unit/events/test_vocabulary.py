from __future__ import annotations

from kvscope.events import KIND_CODES, OUTCOMES, POOL_CODES, REQUEST_OUTCOMES, EventKind, PoolRole
from kvscope.recording import frame_dtypes


def test_codes_are_the_categorical_order_of_event_frames():
    dtypes = frame_dtypes()
    assert [k.value for k, _ in sorted(KIND_CODES.items(), key=lambda kv: kv[1])] == list(dtypes["kind"].categories)
    assert [p.value for p, _ in sorted(POOL_CODES.items(), key=lambda kv: kv[1])] == list(dtypes["pool"].categories)
    assert KIND_CODES[EventKind.REQUEST_ARRIVED] == 0 and POOL_CODES[PoolRole.NONE] == 0


def test_request_outcomes_name_every_ending_kind_once():
    assert REQUEST_OUTCOMES == {EventKind.REQUEST_FINISHED: "finished", EventKind.REQUEST_FAILED: "failed",
                                EventKind.REQUEST_CANCELLED: "cancelled", EventKind.ADMISSION_REJECTED: "rejected"}
    assert OUTCOMES == ("running", "finished", "failed", "cancelled", "rejected")
