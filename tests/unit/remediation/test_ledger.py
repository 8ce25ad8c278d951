from __future__ import annotations

import pytest

from kvscope.events import PoolRole
from remediation.ledger import Reservation, ReservationLedger


def test_totals_follow_reserve_and_release_when_requests_come_and_go():
    ledger = ReservationLedger()
    ledger.reserve(Reservation(1, PoolRole.DRAFT, 5, 20, 0))
    ledger.reserve(Reservation(2, PoolRole.DRAFT, 3, 12, 0))
    assert ledger.total(PoolRole.DRAFT) == 8 and len(ledger) == 2 and 1 in ledger
    assert [r.num_blocks for r in ledger.release(1)] == [5]
    assert ledger.release(1) == []  # twice: nothing more
    assert ledger.total(PoolRole.DRAFT) == 3
    ledger.check()


def test_reserving_again_replaces_the_request_s_reservation_in_that_pool():
    ledger = ReservationLedger()
    ledger.reserve(Reservation(1, PoolRole.DRAFT, 5, 20, 0))
    ledger.reserve(Reservation(1, PoolRole.DRAFT, 7, 28, 1))
    assert ledger.total(PoolRole.DRAFT) == 7
    assert ledger.held(1)[PoolRole.DRAFT].num_blocks == 7
    assert len(ledger.release_all()) == 1 and ledger.totals() == {}
    ledger.check()


def test_rejects_a_negative_reservation():
    with pytest.raises(ValueError, match=">= 0 blocks"):
        ReservationLedger().reserve(Reservation(1, PoolRole.DRAFT, -1, 0, 0))
