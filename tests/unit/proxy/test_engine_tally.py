"""EngineTally's running counts equal the scans over every engine they replace, under random engine changes.

The scans are the multi-version proxy's former per-change code (its gate capacity, the ready engines of each
version its partition reads, the engines it evacuates), written out here again as the reference; the gate
over every version (``newest`` None) is LLMProxy's.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from asyncrl.proxy.engine_tally import EngineTally
from asyncrl.proxy.worker import EngineWorker, PendingUpdate
from asyncrl.testing.fake_engine import FakeEngine, make_request

NUM_ENGINES = 4

changes = st.tuples(
    st.integers(0, NUM_ENGINES - 1),
    st.sampled_from(
        [
            "start",
            "finish",
            "arrive",
            "leave",
            "version",
            "pending",
            "applying",
            "health",
            "control_error",
            "recovering",
            "newest",
        ]
    ),
    st.integers(0, 3),
)


def reference(
    workers: list[EngineWorker], arriving: Counter[int], newest: int | None, slots: int | None
) -> tuple[int, int, Counter[int], int, int, set[int]]:
    usable = [w for w in workers if w.healthy and w.control_error is None]
    gate = [w for w in workers if w.healthy and w.ready and (newest is None or w.version == newest)]
    free = (
        len(gate)
        if slots is None
        else sum(max(0, slots - len(w.in_flight) - arriving[w.index]) for w in gate)
    )
    sick = {w.index for w in workers if not w.healthy and w.control_error is None and w.in_flight}
    ready_at = Counter(w.version for w in usable if w.ready)
    return sum(w.healthy for w in workers), len(usable), ready_at, len(gate), free, sick


@settings(max_examples=200, deadline=None)
@given(slots=st.sampled_from([None, 1, 3]), steps=st.lists(changes, max_size=60))
def test_the_tally_equals_the_scans_after_every_change(slots: int | None, steps: list) -> None:
    tally = EngineTally(NUM_ENGINES, slots)
    arriving: Counter[int] = Counter()
    newest: int | None = 0
    workers = [
        EngineWorker(index=i, client=FakeEngine(), version=0, started_at=0.0) for i in range(NUM_ENGINES)
    ]
    for worker in workers:  # as the proxy does: every load change updates the engine's facts
        worker.on_load_change = lambda w: tally.update(w, arriving[w.index], newest)
    tally.rebuild(workers, arriving, newest)
    attempts = iter(range(10**6))
    for index, change, value in steps:
        worker = workers[index]
        if change == "start":
            worker.start(next(attempts), make_request(f"r{index}"), 0.0)
        elif change == "finish" and worker.in_flight:
            worker.finish(next(iter(worker.in_flight)), 0.0)
        elif change in ("arrive", "leave"):
            arriving[index] += 1 if change == "arrive" or not arriving[index] else -1
            tally.update(worker, arriving[index], newest)
        elif change == "version":
            worker.version = value
        elif change == "pending":
            worker.pending = PendingUpdate(named_tensors={}, version=value) if value % 2 else None
        elif change == "applying":
            worker.applying = value if value % 2 else None
        elif change == "health":
            worker.healthy = not worker.healthy
        elif change == "control_error":
            worker.control_error = RuntimeError("update failed") if worker.control_error is None else None
        elif change == "recovering":
            worker.recovering = not worker.recovering
        elif change == "newest":
            newest = value if value < 3 else None  # None: LLMProxy's gate, over every version
            tally.rebuild(workers, arriving, newest)
        counts = (
            tally.num_healthy,
            tally.num_usable,
            tally.ready_at,
            tally.num_gate_engines,
            tally.gate_slots,
        )
        assert (*counts, tally.sick) == reference(workers, arriving, newest, slots)
