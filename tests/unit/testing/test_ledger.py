"""The ledger: one terminal state per id, completeness against admissions, freshness of trained pairs."""

import pytest

from asyncrl.buffer import Admission, DropKind, DroppedGroup
from asyncrl.testing import Ledger, LedgerError, Outcome


def test_records_one_terminal_state_per_id():
    ledger = Ledger()
    ledger.record_trained("a", start_version=1, trained_version=2)
    ledger.record_dropped("b", Outcome.FILTERED, "zero variance")
    assert ledger.counts() == {"trained": 1, "filtered": 1}
    assert ledger.outcome_of("a") is Outcome.TRAINED and ledger.outcome_of("c") is None
    assert ledger.trained_pairs() == [(1, 2)]
    with pytest.raises(
        LedgerError, match=r"'a' ended twice: first trained \(2\), then aborted \(batch full\)"
    ):
        ledger.record_dropped("a", Outcome.ABORTED, "batch full")
    with pytest.raises(LedgerError, match="'b' ended twice"):
        ledger.record_trained("b", start_version=0, trained_version=0)


def test_drops_need_a_reason_and_a_drop_outcome():
    ledger = Ledger()
    with pytest.raises(ValueError, match="needs a reason"):
        ledger.record_dropped("a", Outcome.FAILED, "")
    with pytest.raises(ValueError, match="record_trained"):
        ledger.record_dropped("a", Outcome.TRAINED, "why")


def test_assert_complete_names_missing_and_unknown_ids():
    ledger = Ledger()
    ledger.record_trained("a", start_version=0, trained_version=0)
    ledger.record_dropped("x", Outcome.FAILED, "crash")
    ledger.assert_complete(["a", "x"])
    with pytest.raises(
        LedgerError, match=r"1 admitted ids never ended \['b'\]; 1 ended ids were never admitted \['x'\]"
    ):
        ledger.assert_complete(["a", "b"])


@pytest.mark.parametrize(("alpha", "fresh"), [(0, False), (0.5, False), (1, True), (1.5, True)])
def test_assert_fresh_uses_whole_versions(alpha, fresh):
    ledger = Ledger()
    ledger.record_trained("a", start_version=3, trained_version=3)
    ledger.record_trained("b", start_version=2, trained_version=3)
    if fresh:
        ledger.assert_fresh(alpha)
    else:
        with pytest.raises(LedgerError, match=r"1 ids trained staler than async_ratio .*\('b', 2, 3\)"):
            ledger.assert_fresh(alpha)


def test_buffer_drop_records_map_to_outcomes():
    ledger = Ledger()
    records = [
        DroppedGroup(
            admission=Admission(ticket_id=i, start_version=0, producer="p", key=f"k{i}"),
            kind=kind,
            reason=reason,
            trainer_version=2,
        )
        for i, (kind, reason) in enumerate(
            [
                (DropKind.STALE, "started at v0"),
                (DropKind.SURPLUS, ""),
                (DropKind.CLOSED, "done"),
                (DropKind.FAILED, "x"),
            ]
        )
    ]
    ledger.record_buffer_drops(records)
    assert [(e.uid, e.outcome, e.reason) for e in ledger.entries()] == [
        ("k0", Outcome.RECLAIMED, "stale: started at v0"),
        ("k1", Outcome.ABORTED, "surplus"),
        ("k2", Outcome.ABORTED, "closed: done"),
        ("k3", Outcome.FAILED, "failed: x"),
    ]
