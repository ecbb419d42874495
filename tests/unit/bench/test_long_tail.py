"""The long-tail benchmark's arithmetic: steady state, time to reward, the bound, its arms and curve points.

Timings are never asserted: these check what is computed from runs (synthetic rows here), and that the arms
are configured as the docs say. The whole benchmark runs in its --quick mode in
tests/integration/test_bench_long_tail.py."""

from __future__ import annotations

import types

import pytest

from asyncrl.config.run import load_run_config
from bench import long_tail
from bench.harness import summary
from bench.workloads import LONG_TAIL


def row(step: int, elapsed: float, **extra: float) -> dict[str, float]:
    base = {
        "step": float(step),
        "elapsed_s": elapsed,
        "wait_s": 0.5,
        "train_s": 1.0,
        "sync_s": 0.1,
        "groups": 4.0,
        "samples": 32.0,
        "response_tokens": 800.0,
        "trained_tokens": 1600.0,
        "max_response_tokens": 100.0,
        "truncated": 0.0,
        "reward_mean": 0.5,
        "max_staleness": 0.0,
        "generated_tokens": 1000.0 * step,
        "engine_busy_s": 0.5 * elapsed,
        "admitted_groups": 6.0 * step,
        "filtered_groups": 2.0 * step,
    }
    return base | extra


def test_steady_state_counts_the_window_after_warmup_only() -> None:
    rows = [row(1, 10.0), row(2, 12.0), row(3, 14.0), row(4, 16.0)]
    got = long_tail.steady_state(rows, warmup=2, cores=2)
    assert got["steps_measured"] == 2 and got["wall_s"] == pytest.approx(4.0)
    assert got["samples_per_s"] == pytest.approx(64 / 4) and got["samples_per_s_per_core"] == pytest.approx(8)
    assert got["generated_tokens_per_step"] == pytest.approx(1000)
    assert got["filter_keep_rate"] == pytest.approx(8 / (8 + 4))  # 2 steps x 4 groups kept, 4 filtered
    assert got["engine_busy_fraction"] == pytest.approx(0.5)


def test_time_to_reach_interpolates_between_checkpoints_and_says_never() -> None:
    curve = [(0.0, 0.3), (10.0, 0.4), (20.0, 0.6)]
    assert long_tail.time_to_reach(curve, 0.5) == pytest.approx(15.0)
    assert long_tail.time_to_reach(curve, 0.4) == pytest.approx(10.0)
    assert long_tail.time_to_reach(curve, 0.7) is None
    # a start already at the target is not a time of 0 (the quick twin's warm start can be): the first trained
    # point at the target, the first crossing after a dip, or never
    assert long_tail.time_to_reach([(0.0, 0.5), (10.0, 0.5)], 0.45) == 10.0
    assert long_tail.time_to_reach([(0.0, 0.5), (10.0, 0.4), (20.0, 0.6)], 0.45) == pytest.approx(12.5)
    assert long_tail.time_to_reach([(0.0, 0.5), (10.0, 0.4)], 0.45) is None


def test_time_to_reward_divides_best_syncs_time_by_asyncs_time_to_the_same_reward() -> None:
    def run(*points: tuple[float, float]) -> dict:
        return {"evals": [{"elapsed_s": t, "eval/reward_mean": r} for t, r in points]}

    sync = [run((10, 0.4), (20, 0.5)), run((10, 0.4), (20, 0.7))]
    fast = [run((5, 0.45), (10, 0.55)), run((5, 0.45), (10, 0.55))]
    got = long_tail.time_to_reward(0.3, sync, fast)
    assert got["per_seed"][0]["ratio"] == pytest.approx(20 / 7.5) and not got["per_seed"][0]["censored"]
    # async never reached 0.7: censored, kept, its time at least its run's 10 s, so its ratio at most 20 / 10
    assert got["per_seed"][1] | {"ratio": pytest.approx(2.0)} == {
        "target_reward": 0.7,
        "best_sync_s": 20,
        "async_s": None,
        "async_run_s": 10,
        "censored": True,
        "ratio": 2.0,
    }
    assert got["mean_over_seeds"]["target_reward"] == pytest.approx(0.6)
    assert got["mean_over_seeds"]["censored"]  # the mean async curve tops out at 0.55
    assert got["mean_over_seeds"]["ratio"] == pytest.approx(2.0)


def test_the_sweep_and_async_arms_set_their_mode_redundancy_and_engines() -> None:
    prompts = LONG_TAIL.prompts_per_step
    configs = {
        arm.name: load_run_config(None, [*LONG_TAIL.run, *arm.config_overrides(prompts)])
        for arm in (*long_tail.SWEEP, *long_tail.ASYNC_ARMS)
    }
    assert all(configs[a.name].controller.mode == "sync" for a in long_tail.SWEEP)
    redundant = {name: c.rollout.max_additional_running_prompts for name, c in configs.items()}
    assert (redundant["sync_queue_r0"], redundant["sync_queue_rb4"], redundant["sync_queue_rb2"]) == (0, 1, 2)
    assert redundant["sync_batch"] == 0 and redundant["sync_batch_oversample_b2"] == 2
    assert configs["sync_batch"].rollout.generation == "batch"
    assert configs["sync_queue_rb2_2engines"].rollout.num_engines == 2
    assert configs["sync_queue_rb2_engine_all_cores"].runtime.driver_cpus == 0
    assert (
        configs["async_a4"].buffer.async_ratio == 4
        and configs["one_step_off"].controller.mode == "one_step_off"
    )
    assert redundant["async_a2"] == 2  # the workload's own redundancy


def test_curve_points_keep_samples_per_step_and_reach_sigma_1_5() -> None:
    points = {p.name: p for p in long_tail.curve_points(LONG_TAIL, quick=False)}
    assert {"workload", "sigma0", "sigma1.5", "group4", "group16", "engines2"} <= set(points)
    assert points["workload"].overrides == ()  # the curve's own reference: the workload, measured beside it
    for point in points.values():
        config = load_run_config(None, [*LONG_TAIL.run, *point.overrides])
        assert config.rollout.rollout_batch_size * config.rollout.num_return_sequences == 32
        assert config.rollout.rollout_batch_size == point.prompts_per_step


def test_a_curve_point_that_changes_the_task_runs_only_inside_the_headroom_band(monkeypatch) -> None:
    """The warm start is evaluated on each point that changes the task (never on the others); one outside the
    band is skipped with its reward, since the filter would drop every group there and no step would end."""
    rewards = {"task.length_sigma=0.0": 0.0, "task.length_sigma=1.5": 0.2}
    evaluated = []

    def fake_child(fn, overrides, num_prompts):  # the warm start's evaluation, without a model
        evaluated.append(overrides[-1])
        return {"eval/reward_mean": rewards[overrides[-1]]}

    monkeypatch.setattr(long_tail, "in_child", fake_child)
    work = types.SimpleNamespace(overrides=lambda: ["model.path=warm"], eval_prompts=8)
    bench = long_tail.Bench(work, 1, scratch=None, cores=2)  # type: ignore[arg-type]
    point = {p.name: p for p in long_tail.curve_points(LONG_TAIL, quick=False)}
    assert "0.000, outside the headroom band" in long_tail.curve_point_without_headroom(
        bench, point["sigma0"]
    )
    assert long_tail.curve_point_without_headroom(bench, point["sigma1.5"]) is None
    assert long_tail.curve_point_without_headroom(bench, point["group16"]) is None
    assert evaluated == ["task.length_sigma=0.0", "task.length_sigma=1.5"]
    assert bench.extra["curve_warm_start"]["sigma0"]["eval/reward_mean"] == 0.0


def test_the_bound_is_made_of_lone_roles_and_never_of_the_arm_it_bounds() -> None:
    """An async arm's best step is the slower of its generation at the lone engine's rate and its training at
    the lone trainer's; the bound is best_sync's measured step over it; the fraction its best over its step."""
    step = {
        "samples_per_s": 32 / 4.0,
        "step_s": 4.0,
        "generated_tokens_per_step": 2000,
        "trained_tokens_per_step": 1000,
        "engine_busy_fraction": 0.8,
    }
    fast = {
        "samples_per_s": 32 / 2.5,
        "step_s": 2.5,
        "generated_tokens_per_step": 2400,
        "trained_tokens_per_step": 1000,
        "engine_busy_fraction": 1.0,
    }
    bench = long_tail.Bench(LONG_TAIL, 1, scratch=None, cores=2)  # type: ignore[arg-type]
    bench.raw = {
        "throughput/best_sync": [step],
        "throughput/async_a2": [fast],
        "bound/engine_alone_best_sync": [{"tokens_per_s": 1000.0}],
        "bound/trainer_alone_best_sync": [{"trained_tokens_per_s": 1000.0}],
        "bound/engine_alone_async": [{"tokens_per_s": 1200.0}],
        "bound/trainer_alone_async": [{"trained_tokens_per_s": 800.0}],
    }
    got = long_tail.bounds(bench)
    arm = got["throughput/async_a2"]
    assert arm["best_step_s"]["median"] == pytest.approx(2.0)  # max(2400/1200, 1000/800 = 1.25)
    assert arm["bound_over_best_sync"]["median"] == pytest.approx(4.0 / 2.0)
    assert arm["fraction_of_bound"]["median"] == pytest.approx(2.0 / 2.5)
    assert got["throughput/best_sync"]["best_step_s"]["median"] == pytest.approx(2.0 + 1.0)
    # busy 2.5 s of the step for 2400 tokens: 960 tokens/s, 0.8 of the lone 1200; sync's 2000 in 3.2 s: 625
    assert arm["engine_rate_of_lone"]["median"] == pytest.approx(0.8)
    assert got["throughput/best_sync"]["engine_rate_of_lone"]["median"] == pytest.approx(0.625)


def test_memory_per_role_is_each_lone_roles_peak_over_its_process_baseline() -> None:
    raw = {
        "bound/engine_alone_async": [{"peak_rss_mb": 700.0, "baseline_rss_mb": 400.0}],
        "bound/trainer_alone_async": [{"peak_rss_mb": 1000.0, "baseline_rss_mb": 400.0}],
    }
    got = long_tail.memory_per_role(raw)
    assert got["engine_alone_async"] == summary([300.0]) and got["trainer_alone_async"] == summary([600.0])
    assert got["process_baseline"]["median"] == 400.0


@pytest.mark.parametrize(("reward", "stops"), [(0.01, True), (0.3, False), (0.95, True)])
def test_a_warm_start_without_headroom_stops_the_run_before_any_arm(reward: float, stops: bool) -> None:
    bench = long_tail.Bench(LONG_TAIL, 1, scratch=None, cores=2)  # type: ignore[arg-type]
    bench.extra["warm_start"] = {"eval/reward_mean": reward}  # as evaluated (no model is loaded here)
    if stops:
        with pytest.raises(SystemExit, match="no headroom"):
            long_tail.check_headroom(bench)
    else:
        long_tail.check_headroom(bench)


def test_every_ratio_has_its_own_key_and_the_time_to_reward_headline_is_time_to_reward(tmp_path):
    """Two ratios once shared a key (tokens/s overwrote samples/s; the samples/s ratio of the time-to-reward runs
    overwrote their time-to-reward headline): each is derived from the runs under a name of its own."""

    def runs(samples: float, tokens: float) -> list[dict[str, float]]:
        return [{"samples_per_s": samples, "tokens_per_s": tokens}] * 3

    bench = long_tail.Bench(LONG_TAIL, 3, tmp_path, 2)
    bench.best_sync = long_tail.SWEEP[-1]
    bench.raw = {
        f"sweep/{long_tail.SWEEP[-1].name}": runs(10, 100),
        "sweep/sync_batch": runs(5, 50),
        "throughput/best_sync": runs(10, 100),
        "throughput/async_a2": runs(20, 300),
        "time_to_reward/best_sync": runs(10, 100),
        "time_to_reward/async_a2": runs(8, 80),
        "curve/sigma0/best_sync": runs(10, 100),
        "curve/sigma0/async_a2": runs(15, 100),
        "partial_time_to_reward/best_sync": runs(10, 100),
        "partial_time_to_reward/partial_rollout_a2": runs(14, 100),
    }

    def seed(sync_s: float, async_s: float | None, run_s: float = 100.0) -> dict[str, float | None]:
        return {"best_sync_s": sync_s, "async_s": async_s, "async_run_s": run_s}

    bench.extra["time_to_reward"] = {
        "per_seed": [seed(15, 10), seed(50, None), seed(25, 10)],
        "mean_over_seeds": seed(20, 10),
    }
    bench.extra["partial_time_to_reward"] = {
        "per_seed": [seed(12, 10), seed(14, 10), seed(13, 10)],
        "mean_over_seeds": seed(13, 10),
    }
    ratios = long_tail.derive_ratios(bench)
    assert {k: v["median"] for k, v in ratios.items()} == pytest.approx(
        {
            f"sweep_sync_batch_over_{long_tail.SWEEP[-1].name}": 0.5,
            "throughput_async_a2_over_best_sync": 2.0,
            "throughput_async_a2_over_best_sync_tokens_per_s": 3.0,
            "time_to_reward_samples_per_s_async_a2_over_best_sync": 0.8,
            "curve_sigma0_async_a2_over_best_sync": 1.5,
            "time_to_reward_async_a2_over_best_sync": 1.5,
            "partial_time_to_reward_samples_per_s_partial_rollout_a2_over_best_sync": 1.4,
            "partial_time_to_reward_partial_rollout_a2_over_best_sync": 1.3,
        }
    )
    headline = ratios["time_to_reward_async_a2_over_best_sync"]
    # no seed dropped: the one that never reached the target is kept as censored, at most 50 / 100 s
    assert headline["runs"] == pytest.approx([1.5, 0.5, 2.5]) and headline["censored"] == [False, True, False]
    assert (headline["reached"], headline["seeds"], headline["mean_over_seeds"]) == (2, 3, 2.0)


def test_a_stopped_curve_keeps_its_points_and_a_continued_one_measures_only_the_rest(monkeypatch, tmp_path):
    """The curve writes the result after every point; a run stopped after two of them, continued, runs the
    remaining points only and ends with every point once (a skipped point stays skipped, with its reason)."""
    measured: list[str] = []

    def fake_run_arms(arms, repeats, on_run):
        measured.extend(arms)
        return {name: [{"samples_per_s": 1.0}] * repeats for name in arms}

    monkeypatch.setattr(long_tail.harness, "run_arms", fake_run_arms)
    monkeypatch.setattr(long_tail.Bench, "overrides", lambda self, arm, point=None: ())
    monkeypatch.setattr(long_tail, "warm_start_digest", lambda work: "digest")
    monkeypatch.setattr(
        long_tail,
        "curve_point_without_headroom",
        lambda bench, point: "no headroom" if point.name == "sigma0" else None,
    )

    class Stopped(Exception):
        pass

    def stop_after_two_points() -> None:
        if len(stopped.studies["curve"]["point_provenance"]) + len(stopped.studies["curve"]["skipped"]) == 2:
            raise Stopped

    stopped = long_tail.Bench(LONG_TAIL, 3, tmp_path, 2, best_sync=long_tail.SWEEP[0])
    stopped.checkpoint = stop_after_two_points
    with pytest.raises(Stopped):
        long_tail.stage_curve(stopped)
    first = list(measured)
    assert stopped.studies["curve"]["finished"] is False and first == [
        "curve/workload/best_sync",
        "curve/workload/async_a2",
    ]  # workload measured, sigma0 skipped: two points

    continued = long_tail.Bench(LONG_TAIL, 3, tmp_path, 2, best_sync=long_tail.SWEEP[0])
    continued.raw, continued.studies = dict(stopped.raw), dict(stopped.studies)
    long_tail.stage_curve(continued)
    names = [p.name for p in long_tail.curve_points(LONG_TAIL, quick=False)]
    study = continued.studies["curve"]
    assert study["finished"] is True and set(study["skipped"]) == {"sigma0"}
    assert set(study["point_provenance"]) == set(names) - {"sigma0"}
    assert measured[len(first) :] == [
        f"curve/{name}/{arm}"
        for name in names
        if name not in ("workload", "sigma0")
        for arm in ("best_sync", "async_a2")
    ]
    assert study["points"] == measured  # every measured arm once, in order


def test_a_layout_point_is_also_divided_by_the_better_sync_of_the_same_work() -> None:
    """Two engines once showed async 1.34x over a two-engine sync while the one-engine sync of the same work in
    the same curve, the better sync there, put it below 1."""

    def runs(*values: float) -> list[dict[str, float]]:
        return [{"samples_per_s": value} for value in values]

    raw = {
        "curve/workload/best_sync": runs(6.0, 6.0, 6.0),
        "curve/engines2/best_sync": runs(4.0, 4.0, 4.0),
        "curve/engines2/async_a2": runs(5.4, 5.4, 5.4),
    }
    ratios = long_tail.over_best_curve_sync(raw, "curve/engines2/async_a2")
    ratio = ratios["curve_engines2_async_a2_over_best_curve_sync"]
    assert ratio["denominator"] == "curve/workload/best_sync" and ratio["median"] == pytest.approx(0.9)


def test_the_sweep_choice_is_by_paired_ratio_and_names_the_redundancy_edge(tmp_path) -> None:
    bench = long_tail.Bench(LONG_TAIL, 3, tmp_path, 2)
    rates = {
        "sync_queue_r0": 4.0,
        "sync_queue_rb4": 7.0,
        "sync_queue_rb2": 9.0,
        "sync_queue_rb2_2engines": 9.5,
    }
    bench.raw = {f"sweep/{name}": [{"samples_per_s": rate}] * 3 for name, rate in rates.items()}
    choice = long_tail.sweep_choice(bench)
    assert (choice["name"], choice["runner_up"]) == ("sync_queue_rb2_2engines", "sync_queue_rb2")
    assert "0.5, is its largest value" in choice["edge"]
    bench.best_sync = next(arm for arm in long_tail.SWEEP if arm.name == "sync_queue_rb2")
    record = long_tail.best_sync_record(bench)  # the stages ran beside a sync the paired ratio puts behind
    assert record["by_paired_ratio"]["name"] == "sync_queue_rb2_2engines"
    assert record["ran_beside_over_best_of_sweep"]["median"] == pytest.approx(9.0 / 9.5)
