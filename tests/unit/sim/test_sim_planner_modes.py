"""``asyncrl plan`` and multi_version: listed among the candidates, recommended or not, always with a reason."""

from __future__ import annotations

from asyncrl.app.planner import SEARCHED_MODES, Candidate, Outcome, Planner, PlanResult, choose
from asyncrl.sim.plan import recommend
from tests.unit.sim.test_sim_planner import SMALL

PROPOSITION = recommend(64, 8, 1.0, 4.0, 0.5, 1, 2.0)


def outcome(mode: str, alpha: float, samples_per_s: float, staleness: float, engine_busy: float) -> Outcome:
    return Outcome(
        candidate=Candidate(mode=mode, alpha=alpha, train_gpus=4),
        step_s=100 / samples_per_s,
        samples_per_s=samples_per_s,
        mean_staleness=staleness,
        engine_busy=engine_busy,
        trainer_busy=0.5,
        converged=True,
    )


def result_of(outcomes: list[Outcome], tolerance: float, gpus: int = 8) -> PlanResult:
    recommended, runner_up = choose(outcomes, tolerance)
    return PlanResult(
        gpus=gpus,
        gpus_per_engine=1,
        baseline=outcomes[0],
        outcomes=outcomes,
        recommended=recommended,
        runner_up=runner_up,
        proposition=PROPOSITION,
    )


def test_multi_version_is_searched_by_default() -> None:
    assert "multi_version" in SEARCHED_MODES


def test_multi_version_recommended_where_it_is_as_fast_and_fresher() -> None:
    """A long tail that partial rollout cannot cut (no in-flight update) and async waits out: multi_version
    keeps the throughput of async α = 2 with fresher samples, so it wins within the tolerance."""
    outcomes = [
        outcome("sync", 0, 1.0, 0.0, 0.5),
        outcome("async", 2, 2.00, 1.3, 0.95),
        outcome("multi_version", 1, 1.99, 0.6, 0.95),
    ]
    result = result_of(outcomes, tolerance=0.02)
    assert result.mode_verdict("multi_version") == "recommended (multi_version a=1 4T/4I)"
    assert result.to_json()["multi_version"] == "recommended (multi_version a=1 4T/4I)"


def test_multi_version_not_recommended_where_its_engines_idle() -> None:
    outcomes = [
        outcome("sync", 0, 1.0, 0.0, 0.5),
        outcome("async", 1, 2.00, 0.8, 0.97),
        outcome("multi_version", 1, 1.60, 0.6, 0.80),
        outcome("multi_version", 2, 1.70, 1.2, 0.85),
    ]
    verdict = result_of(outcomes, tolerance=0.02).mode_verdict("multi_version")
    assert verdict == (
        "not recommended: its best, multi_version a=2 4T/4I, has 15.0% lower throughput "
        "(engines busy 85% against 97%)"
    )
    assert result_of(outcomes[:2], tolerance=0.02).mode_verdict("multi_version") == "not simulated"


def test_a_simulated_long_tail_where_multi_version_loses_and_says_why() -> None:
    """The simulator's own answer on a long-tailed workload with a slow weight sync (20 s): multi_version is
    fresher than async (its legacy versions drain while the newest serves) but slower, because the engines
    left on a legacy version idle as their last requests finish."""
    tail = [
        *SMALL,
        "lengths.distribution=lognormal",
        "lengths.sigma=1.5",
        "rollout.max_new_tokens=8192",
        "rollout.rollout_batch_size=32",
        "engine.weight_update_s=20",
    ]
    planner = Planner(None, tail, gpus=8)
    outcomes = [
        planner.evaluate(Candidate(mode="sync", alpha=0.0, train_gpus=None)),
        planner.evaluate(Candidate(mode="async", alpha=1.0, train_gpus=4)),
        planner.evaluate(Candidate(mode="multi_version", alpha=1.0, train_gpus=4)),
    ]
    sync, async_, multi = outcomes
    assert multi.mean_staleness < async_.mean_staleness and multi.samples_per_s < async_.samples_per_s
    assert multi.engine_busy < async_.engine_busy
    strict = result_of(outcomes, tolerance=0.02)
    assert strict.recommended is async_
    assert strict.mode_verdict("multi_version").startswith(
        "not recommended: its best, multi_version a=1 4T/4I, has"
    )
    assert "lower throughput (engines busy" in strict.mode_verdict("multi_version")
    lenient = result_of(outcomes, tolerance=0.25)  # a user who trades 25 % of throughput for freshness
    assert lenient.recommended is multi and lenient.mode_verdict("multi_version").startswith("recommended")
