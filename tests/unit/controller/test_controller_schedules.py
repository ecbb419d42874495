"""The DESIGN.md §5 invariants of every mode, under hundreds of shuffled schedules on virtual time."""

from __future__ import annotations

import pytest
from controller_harness import Scenario, run_scenario

from asyncrl.data.base import TaskSample
from asyncrl.rollout.prompt_source import PromptSource
from asyncrl.sim.clock import run_seeds, run_shuffled
from asyncrl.testing.ledger import Outcome as End

NUM_SCHEDULES = 500
"""Schedules per mode (the issue's bar); variants of a mode (filters, redundancy, batch generation) run fewer."""
NUM_VARIANT_SCHEDULES = 150
CUT_AT_END = frozenset({"aborted: producer stopped", "closed: training finished"})
"""The ledger reasons of groups cut off by the end of a run (in flight, or finished and buffered)."""
MODE_SCENARIOS = ("sync", "one_step_off", "async_2", "partial_rollout", "multi_version")

SCENARIOS = {
    "sync": Scenario(mode="sync"),
    "sync_batch": Scenario(mode="sync", generation="batch"),
    "one_step_off": Scenario(mode="one_step_off"),
    "async_2": Scenario(mode="async", async_ratio=2.0),
    "async_redundant_filter": Scenario(
        mode="async", async_ratio=1.0, redundant=2, filter="zero_variance", reward_fail_rate=0.1
    ),
    "partial_rollout": Scenario(mode="partial_rollout", async_ratio=1.0, train_s=0.5),
    "sync_redundant": Scenario(mode="sync", redundant=1, filter="zero_variance"),
    # Batch generation with filtering once deadlocked: only the filtered groups' places free up.
    "sync_batch_filter": Scenario(mode="sync", generation="batch", filter="zero_variance"),
    # Over-sampling: a batch round starts the batch plus the redundant prompts; the surplus is dropped, recorded.
    "sync_batch_oversample": Scenario(mode="sync", generation="batch", redundant=2, filter="zero_variance"),
    # ROLL Flash's get_batch: the batch waits for older admitted groups, so none is reclaimed stale
    "partial_rollout_wait_for_older": Scenario(
        mode="partial_rollout", async_ratio=1.0, train_s=0.5, wait_for_older=True
    ),
    "async_wait_for_older": Scenario(mode="async", async_ratio=1.0, train_s=0.5, wait_for_older=True),
    # redundant admissions are not waited for (they may be reclaimed): no deadlock, invariants hold
    "partial_rollout_wait_for_older_redundant_filter": Scenario(
        mode="partial_rollout",
        async_ratio=1.0,
        redundant=2,
        filter="zero_variance",
        reward_fail_rate=0.1,
        train_s=0.5,
        wait_for_older=True,
    ),
    "multi_version": Scenario(mode="multi_version", async_ratio=1.0, train_s=0.5),
    "multi_version_2": Scenario(mode="multi_version", async_ratio=2.0, num_engines=3, batch=3, train_s=0.5),
    # Redundant admissions may be reclaimed (the batch does not wait for them): no deadlock, invariants hold.
    "multi_version_redundant_filter": Scenario(
        mode="multi_version",
        async_ratio=1.0,
        redundant=2,
        filter="zero_variance",
        reward_fail_rate=0.1,
        train_s=0.5,
    ),
}


def check_invariants(scenario: Scenario, outcome) -> None:
    ratio = (
        0.0 if scenario.mode == "sync" else 1.0 if scenario.mode == "one_step_off" else scenario.async_ratio
    )
    outcome.ledger.assert_complete(outcome.admitted)  # conservation: each admitted prompt ended exactly once
    outcome.ledger.assert_fresh(ratio)  # freshness: started at version >= trained version - α
    assert outcome.accounting.is_balanced
    # the prompt source agrees with the ledger: a prompt left unfinished was cut off by the end of the run,
    # never one that ended mid-run (a buffered group dropped stale once stayed unfinished and was re-issued)
    ended_mid_run = {e.uid for e in outcome.ledger.entries() if e.reason not in CUT_AT_END}
    assert ended_mid_run.isdisjoint(outcome.unfinished), sorted(ended_mid_run & set(outcome.unfinished))
    assert [version for version, _ in outcome.batches] == list(range(scenario.num_steps))
    trained = [t for _, groups in outcome.batches for g in groups for t in g.trajectories]
    assert all(len(g) <= scenario.group for _, groups in outcome.batches for g in groups)
    if scenario.mode != "partial_rollout":  # one version per trajectory (drain policy, multi-version pinning)
        spans = [t.version_span for t in trained]
        assert all(low == high for low, high in spans), spans
    if scenario.mode == "multi_version":  # the engines' window of versions never exceeds ⌊α⌋ + 1
        assert outcome.proxy_stats["max_versions_alive"] <= int(scenario.async_ratio) + 1
        assert outcome.proxy_stats["num_calls"] == 0
    waits = scenario.wait_for_older or (scenario.wait_for_older is None and scenario.mode == "multi_version")
    if waits and scenario.redundant == 0 and scenario.filter == "none":
        # no trajectory dropped: every admitted group is trained, or cut off only by the end of the run
        assert [
            e for e in outcome.ledger.entries() if e.outcome is not End.TRAINED and e.reason not in CUT_AT_END
        ] == []


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_invariants_hold_under_shuffled_schedules(name: str) -> None:
    scenario = SCENARIOS[name]

    async def one(seed: int) -> None:
        check_invariants(scenario, await run_scenario(scenario, seed))

    count = NUM_SCHEDULES if name in MODE_SCENARIOS else NUM_VARIANT_SCHEDULES
    assert run_seeds(one, range(count)) == count


def test_partial_rollout_really_mixes_versions_in_some_trajectory() -> None:
    """Guards the test above: in-flight updates must actually happen, or its partial-rollout case proves nothing."""
    spans = [
        t.version_span
        for seed in range(10)
        for _, groups in run_shuffled(
            lambda seed=seed: run_scenario(SCENARIOS["partial_rollout"], seed), seed
        ).batches
        for g in groups
        for t in g.trajectories
    ]
    assert any(low < high for low, high in spans)


def test_async_trains_stale_samples_and_sync_never_does() -> None:
    async_run = run_shuffled(lambda: run_scenario(SCENARIOS["async_2"], 3), 3)
    sync_run = run_shuffled(lambda: run_scenario(SCENARIOS["sync"], 3), 3)
    assert any(start < trained for start, trained in async_run.ledger.trained_pairs())
    assert all(start == trained for start, trained in sync_run.ledger.trained_pairs())


def test_filtering_and_failures_are_recorded_with_reasons() -> None:
    outcome = run_shuffled(lambda: run_scenario(SCENARIOS["async_redundant_filter"], 11), 11)
    counts = outcome.ledger.counts()
    assert counts.get(End.FILTERED.value, 0) > 0
    assert all(entry.reason for entry in outcome.ledger.entries() if entry.outcome is not End.TRAINED)


def test_sync_batches_equal_a_plain_synchronous_loop() -> None:
    """Invariant 4: with α = 0 batch k holds exactly the k-th B prompts of the stream, in stream order."""
    scenario = SCENARIOS["sync"]
    for seed in range(20):
        outcome = run_shuffled(lambda seed=seed: run_scenario(scenario, seed), seed)
        keys = [[g.prompt_uid for g in groups] for _, groups in outcome.batches]
        expected = [outcome.admitted[k * scenario.batch : (k + 1) * scenario.batch] for k in range(len(keys))]
        assert keys == expected
        plain = PromptSource(
            [TaskSample(uid=f"p{i}", prompt=f"q{i}", answer="0") for i in range(50)], seed=seed
        )
        assert [k for batch in keys for k in batch] == [plain.next().key for _ in range(sum(map(len, keys)))]


def test_multi_version_really_migrates_and_serves_several_versions_at_once() -> None:
    """Guards the multi-version cases above: updates must re-partition engines and move requests."""
    scenario = SCENARIOS["multi_version_2"]
    stats = [
        run_shuffled(lambda seed=seed: run_scenario(scenario, seed), seed).proxy_stats for seed in range(10)
    ]
    assert sum(s["num_migrations"] for s in stats) > 0
    assert max(s["max_versions_alive"] for s in stats) >= 2


def dropped_mid_run(outcome) -> list:
    """Ledger entries of admitted groups that ended untrained before the run's end (stale or surplus)."""
    return [
        e for e in outcome.ledger.entries() if e.outcome is not End.TRAINED and e.reason not in CUT_AT_END
    ]


def test_partial_rollout_reclaims_stragglers_unless_it_waits_for_older() -> None:
    """Guards the wait_for_older cases above: on the same schedules the plain α = 1 batch takes the first fresh
    groups and reclaims some older straggler, the waiting one reclaims none."""
    plain, waiting = SCENARIOS["partial_rollout"], SCENARIOS["partial_rollout_wait_for_older"]
    seeds = range(20)
    assert any(dropped_mid_run(run_shuffled(lambda s=s: run_scenario(plain, s), s)) for s in seeds)
    assert not any(dropped_mid_run(run_shuffled(lambda s=s: run_scenario(waiting, s), s)) for s in seeds)
