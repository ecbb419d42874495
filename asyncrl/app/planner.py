"""``asyncrl plan``'s search: the mode, async ratio α and train/infer split of a cluster, chosen by simulating
the candidates on the cost model derived from a model and a hardware profile.

Key decision: a recommendation is the fastest simulated steady state, not a formula. Proposition 2 (ROLL
Flash) assumes perfect overlap and a fixed longest sample; the simulator runs the real scheduler, so the
candidates it compares include what the bound leaves out (the α window, weight-sync pauses, queueing behind
long requests). Proposition 2's β* still seeds the split search and is printed beside the result.

The search, about a dozen simulations:
1. colocated sync on every GPU (the baseline every speedup is quoted against);
2. partial rollout at α = 2 on train shares of 1/8 … 7/8 of the GPUs and at β*;
3. at the best split, every asynchronous mode and α (one_step_off; async, partial rollout and multi_version at
   each α). ``mode_verdict`` says per mode whether it was recommended and, if not, why (multi_version: DORA's
   answer to long tails, which the simulator often finds slower: its legacy engines idle as their work drains).
Among the candidates within ``tolerance`` of the best throughput, the least stale wins (a fresher sample
costs nothing there), so α grows only where it buys throughput.

Memory (``memory.check``, on by default): every layout is first planned by ``app.plan_memory`` (the memory plan
``asyncrl doctor --hardware`` prints: per role, per shared GPU, the critic and LoRA included, and each node's host
RAM). A split that does not fit is dropped before it is simulated, and a colocated baseline that does not fit is
simulated as the yardstick but never recommended; ``PlanResult.dropped`` names each with the GPU (or node's host
RAM) that overflows, its role and its largest term.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from asyncrl.app.plan_memory import Drop, Layout, MemoryCheck, engine_keys
from asyncrl.app.simulate import simulate
from asyncrl.config.loader import apply_overrides, read_yaml_file
from asyncrl.config.sim import SimConfig
from asyncrl.modes import async_ratio_for
from asyncrl.runtime.placement_check import (
    ENGINE_ROLE,
    TRAINER_ROLE,
    PlacementError,
    RoleBundles,
    check_placement,
    colocated_pairs,
    layout_of,
)
from asyncrl.sim import cost
from asyncrl.sim.derive import length_moments, load_sim_config, mean_running_context
from asyncrl.sim.plan import Plan, recommend

PLAN_STEADY = (
    "steady_state.enabled=true",
    "steady_state.warmup_steps=3",
    "steady_state.window_steps=5",
    "steady_state.tolerance=0.05",
    "controller.num_steps=30",
    "timeline=none",
)
"""A planning simulation's steady state: shorter windows than the benchmarks' (a dozen runs must stay quick);
the config's own keys, given after, override them."""


SEARCHED_MODES = ("one_step_off", "async", "partial_rollout", "multi_version")
"""The schedules ``Planner.search`` tries at the best split (sync colocated and the split search always run)."""


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """A placement and schedule: ``train_gpus`` None is colocated (every GPU generates, then trains)."""

    mode: str
    alpha: float
    train_gpus: int | None

    def label(self, gpus: int) -> str:
        if self.train_gpus is None:
            return f"{self.mode} colocated on {gpus}"
        return f"{self.mode} a={self.alpha:g} {self.train_gpus}T/{gpus - self.train_gpus}I"


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """One candidate's simulated steady state."""

    candidate: Candidate
    step_s: float
    samples_per_s: float
    mean_staleness: float
    engine_busy: float
    trainer_busy: float
    converged: bool


@dataclass(frozen=True, kw_only=True)
class PlanResult:
    gpus: int
    gpus_per_engine: int
    baseline: Outcome
    outcomes: list[Outcome]
    recommended: Outcome
    runner_up: Outcome | None
    """None when the cluster holds one layout only (``--gpus 1``: colocated sync)."""
    proposition: Plan | None
    """Proposition 2's split; None where there is no split (the same one-layout clusters)."""
    dropped: tuple[tuple[Candidate, Drop], ...] = ()
    """The candidates whose memory plan does not fit the hardware, each with why (never recommended)."""
    hardware: str = ""
    """The hardware profile memory was planned for."""
    engine: tuple[str, ...] = ()
    """The recommended layout's engine as ``asyncrl train`` keys (``plan_memory.engine_keys``): the engine
    simulated and planned, so a run set up from the plan is the one it checked (the built-in engine's slots
    are those its KV budget admits: ``sim.derive.reserved_slots``)."""

    def placement_text(self, candidate: Candidate) -> str:
        """The layout the runtime builds for ``candidate``, or why it refuses it (never recommended then)."""
        try:
            return placement_of(candidate, self.gpus, self.gpus_per_engine)
        except PlacementError as refused:
            return f"refused by the runtime: {refused}"

    def speedup(self, outcome: Outcome) -> float:
        return outcome.samples_per_s / self.baseline.samples_per_s

    def to_json(self) -> dict[str, Any]:
        return {
            "gpus": self.gpus,
            "baseline": asdict(self.baseline),
            "recommended": asdict(self.recommended) | {"speedup": self.speedup(self.recommended)},
            "runner_up": None
            if self.runner_up is None
            else asdict(self.runner_up) | {"speedup": self.speedup(self.runner_up)},
            "why_runner_up_lost": None
            if self.runner_up is None
            else why_lost(self.recommended, self.runner_up, self.gpus),
            "outcomes": [asdict(o) | {"speedup": self.speedup(o)} for o in self.outcomes],
            "proposition_2": None if self.proposition is None else asdict(self.proposition),
            "placements": {
                o.candidate.label(self.gpus): self.placement_text(o.candidate) for o in self.outcomes
            },
            "multi_version": self.mode_verdict("multi_version"),
            "engine": list(self.engine),
            "dropped_for_memory": {
                candidate.label(self.gpus): drop.text(self.hardware) for candidate, drop in self.dropped
            },
        }

    def mode_verdict(self, mode: str) -> str:
        """Whether ``mode`` was recommended; if not, why its best candidate lost to the recommended one."""
        tried = [o for o in self.outcomes if o.candidate.mode == mode]
        if not tried:
            return "not simulated"
        if self.recommended.candidate.mode == mode:
            return f"recommended ({self.recommended.candidate.label(self.gpus)})"
        best = max(tried, key=lambda o: o.samples_per_s)
        reason = why_lost(self.recommended, best, self.gpus)
        return f"not recommended: its best, {best.candidate.label(self.gpus)}, has {reason}"


def candidate_overrides(candidate: Candidate, gpus: int, gpus_per_engine: int) -> list[str]:
    """The config keys of one candidate on a cluster of ``gpus`` accelerators."""
    alpha = async_ratio_for(candidate.mode, candidate.alpha)
    keys = [f"controller.mode={candidate.mode}", f"buffer.async_ratio={alpha:g}"]
    if candidate.train_gpus is None:
        return [*keys, "trainer.colocated=true", f"rollout.num_engines={gpus // gpus_per_engine}"]
    engines = (gpus - candidate.train_gpus) // gpus_per_engine
    return [
        *keys,
        "trainer.colocated=false",
        f"trainer.num_gpus={candidate.train_gpus}",
        f"rollout.num_engines={engines}",
    ]


class Planner:
    """Simulates candidates of one workload (a config file and overrides with ``model`` and ``hardware``)."""

    def __init__(
        self, path: str | None, overrides: Sequence[str], gpus: int, host_gb: float | None = None
    ) -> None:
        """``host_gb``: one node's host RAM for the memory check, in GB (``--host-gb``; default the hardware
        profile's)."""
        self.path, self.overrides, self.gpus = path, [*PLAN_STEADY, *overrides], gpus
        self.base = load_sim_config(path, self.overrides)
        if not self.base.model:
            raise ValueError("asyncrl plan needs model=... and hardware=... (the costs derive from them)")
        self.gpus_per_engine = self.base.engine.gpus_per_engine
        if gpus < 2 * self.gpus_per_engine and not self.placeable(COLOCATED_SYNC):
            raise ValueError(
                f"--gpus {gpus} leaves no room for a trainer beside an engine of {self.gpus_per_engine}, and "
                f"the runtime cannot colocate them: {self.refusal(COLOCATED_SYNC)}"
            )
        self._cache: dict[Candidate, Outcome] = {}
        if host_gb is not None and not self.base.memory.check:
            raise ValueError(
                f"--host-gb {host_gb:g} sets the node's host RAM for the memory check, which memory.check=false "
                "turns off: drop one"
            )
        self.memory = MemoryCheck(self.base, gpus, host_gb) if self.base.memory.check else None
        if self.memory is not None and not sets_slots(path, overrides):
            self._fit_engine_slots(host_gb)

    def _fit_engine_slots(self, host_gb: float | None) -> None:
        """The built-in engine's slots derived from the simulation's keys (``sim.derive.reserved_slots``, in a
        budget of ``cost.memory_utilization`` of the GPU less the weights) lowered, where they are more, to what
        the engine itself allocates (``MemoryCheck.engine_slot_limit``: for small models its own limit is the
        tighter), so that the engine simulated and planned is one that starts. Slots the config sets are kept,
        and a layout whose pool the engine refuses is dropped."""
        limit = self.memory.engine_slot_limit()
        if limit is None or limit >= self.base.engine.max_running_requests:
            return
        self.overrides.append(f"engine.max_running_requests={max(1, limit)}")
        self.base = load_sim_config(self.path, self.overrides)
        self.memory = MemoryCheck(self.base, self.gpus, host_gb)

    def config(self, candidate: Candidate) -> SimConfig:
        keys = candidate_overrides(candidate, self.gpus, self.gpus_per_engine)
        return load_sim_config(self.path, [*self.overrides, *keys])

    def evaluate(self, candidate: Candidate) -> Outcome:
        if candidate not in self._cache:
            totals = simulate(self.config(candidate)).totals
            self._cache[candidate] = Outcome(
                candidate=candidate,
                step_s=totals.get("steady_mean_step_s", totals["mean_step_s"]),
                samples_per_s=totals.get("steady_samples_per_s", totals["samples_per_s"]),
                mean_staleness=totals["mean_staleness"],
                engine_busy=totals["engine_busy_fraction"],
                trainer_busy=totals["trainer_busy_fraction"],
                converged=bool(totals.get("steady_converged", 0.0)),
            )
        return self._cache[candidate]

    def split_candidates(self, beta_star: float) -> list[int]:
        """Train GPU counts to try: eighths of the cluster and β*'s, each leaving whole engines."""
        g = self.gpus_per_engine
        shares = [k / 8 for k in range(1, 8)] + [beta_star]
        counts = set()
        for share in shares:
            engines = max(1, round(self.gpus * (1 - share) / g))
            train = self.gpus - engines * g
            if train >= 1:
                counts.add(train)
        return sorted(counts)

    def proposition(self, alpha: float) -> Plan:
        """Proposition 2's split from the derived costs: a worker is one accelerator; a sample's mean
        generation time is its share of an engine's full-batch throughput, the longest one runs alone."""
        config, engine = self.base, self.base.engine
        context = mean_running_context(config)  # paged KV: as many as the KV holds at the mean context
        batch = max(1, min(engine.max_running_requests, int(engine.max_kv_tokens // context)))
        full_step = cost.decode_step_s(engine, batch, round(batch * context))
        mean_len, _ = length_moments(config)
        mu_gen = mean_len * full_step / batch * engine.gpus_per_engine
        longest = config.rollout.max_new_tokens
        l_gen = (
            longest
            * cost.decode_step_s(engine, 1, config.prompt_tokens + longest // 2)
            * engine.gpus_per_engine
        )
        mu_train = (config.prompt_tokens + mean_len) * config.trainer.gpu_s_per_token
        samples = config.rollout.rollout_batch_size * config.rollout.num_return_sequences
        return recommend(
            samples, self.gpus, mu_gen, max(l_gen, mu_gen), mu_train, config.trainer.epochs, alpha
        )

    def layout(self, candidate: Candidate) -> Layout:
        """What memory depends on in ``candidate``: its trainer ranks, engines and whether they share GPUs."""
        engines_gpus = self.gpus if candidate.train_gpus is None else self.gpus - candidate.train_gpus
        ranks = self.gpus if candidate.train_gpus is None else candidate.train_gpus
        return Layout(ranks, engines_gpus // self.gpus_per_engine, candidate.train_gpus is None)

    def memory_drop(self, candidate: Candidate) -> Drop | None:
        """Why ``candidate``'s memory plan does not fit the hardware, or None (also with ``memory.check``
        off)."""
        return None if self.memory is None else self.memory.drop(self.layout(candidate))

    def placeable(self, candidate: Candidate) -> bool:
        """Whether the runtime places ``candidate`` on this cluster (``placement_of``)."""
        return not self.refusal(candidate)

    def refusal(self, candidate: Candidate) -> str:
        """Why the runtime refuses ``candidate`` ('' when it places it)."""
        try:
            placement_of(candidate, self.gpus, self.gpus_per_engine)
        except PlacementError as refused:
            return str(refused)
        return ""

    def search(
        self,
        alphas: Sequence[float] = (1, 2, 4),
        tolerance: float = 0.02,
        modes: Sequence[str] = SEARCHED_MODES,
    ) -> PlanResult:
        """The candidates of the module docstring; only those the runtime places are recommended (a refused
        colocated baseline is still simulated: speedups are quoted against it)."""
        baseline = self.evaluate(COLOCATED_SYNC)
        dropped = [(COLOCATED_SYNC, d) for d in [self.memory_drop(COLOCATED_SYNC)] if d is not None]
        outcomes, proposition = [baseline], None
        # with one device per engine colocated sync is the only layout
        if self.gpus >= 2 * self.gpus_per_engine:
            proposition = self.proposition(2.0)
            split_outcomes, split_drops = self._split_outcomes(proposition.beta, alphas, modes)
            dropped += split_drops
            outcomes += split_outcomes
            outcomes = list({o.candidate: o for o in outcomes}.values())
        refused = {candidate for candidate, _ in dropped}
        eligible = [o for o in outcomes if o.candidate not in refused and self.placeable(o.candidate)]
        if not eligible:
            raise self._nothing_fits(dropped)
        recommended, runner_up = choose(eligible, tolerance)
        runs = self.memory or MemoryCheck(self.base, self.gpus)  # the run a layout stands for, checked or not
        engine = engine_keys(runs.run_config(self.layout(recommended.candidate)))
        return PlanResult(
            gpus=self.gpus,
            gpus_per_engine=self.gpus_per_engine,
            baseline=baseline,
            outcomes=sorted(outcomes, key=lambda o: -o.samples_per_s),
            recommended=recommended,
            runner_up=runner_up,
            proposition=proposition,
            dropped=tuple(dropped),
            hardware=self.memory.hardware.name if self.memory else "",
            engine=tuple(engine),
        )

    def _split_outcomes(
        self, beta: float, alphas: Sequence[float], modes: Sequence[str]
    ) -> tuple[list[Outcome], list[tuple[Candidate, Drop]]]:
        """Steps 2 and 3 of the module docstring: partial rollout at α = 2 on each train share (eighths and
        ``beta``, Proposition 2's β*) whose memory plan fits, then every schedule of ``modes`` at the fastest of
        those splits; (their outcomes, splits first, and the splits dropped for memory)."""
        splits, dropped = [], []
        for train in self.split_candidates(beta):
            candidate = Candidate(mode="partial_rollout", alpha=2.0, train_gpus=train)
            drop = self.memory_drop(candidate)
            if drop is None:
                splits.append(self.evaluate(candidate))
            else:
                dropped.append((candidate, drop))
        schedules = []
        if splits:  # the schedules share the best split's layout, so its memory verdict too
            best_split = max(splits, key=lambda o: o.samples_per_s).candidate.train_gpus
            schedules = [Candidate(mode="one_step_off", alpha=1.0, train_gpus=best_split)]
            schedules += [
                Candidate(mode=mode, alpha=float(a), train_gpus=best_split)
                for mode in ("async", "partial_rollout", "multi_version")
                for a in alphas
            ]
        schedules = [c for c in schedules if c.mode in modes]
        return [*splits, *(self.evaluate(c) for c in schedules)], dropped

    def _nothing_fits(self, dropped: list[tuple[Candidate, Drop]]) -> ValueError:
        """The error when no candidate is left to recommend: each dropped layout with what overflows, and the
        settings that would make one fit."""
        hardware = self.memory.hardware.name if self.memory else self.base.hardware
        why = "; ".join(f"{c.label(self.gpus)}: {d.text(hardware)}" for c, d in dropped)
        fixes = "more GPUs, a smaller model, or lighter trainer settings (memory.*, or memory.train_config)"
        if any(d.term == "KV pool" for _, d in dropped):  # the built-in engine's slots are what overflow
            fixes += (
                ", or a smaller built-in engine pool (fewer engine.max_running_requests, a shorter "
                "engine.max_model_len or engine.max_kv_tokens: the simulation's keys, or memory.train_config's)"
            )
        return ValueError(f"no candidate on {self.gpus} GPU(s) fits memory ({why}); {fixes} would")


def sets_slots(path: str | None, overrides: Sequence[str]) -> bool:
    """Whether the config file or the overrides set ``engine.max_running_requests`` (kept as given then)."""
    data = apply_overrides(SimConfig, read_yaml_file(path) if path is not None else {}, overrides)
    return "max_running_requests" in (data.get("engine") or {})


COLOCATED_SYNC = Candidate(mode="sync", alpha=0.0, train_gpus=None)
"""The baseline: every GPU generates, then trains."""
GPUS_PER_NODE = 8
"""Accelerators per node the placement check assumes for ``--gpus`` (the common 8-GPU node)."""


def placement_of(candidate: Candidate, gpus: int, gpus_per_engine: int) -> str:
    """The layout the runtime builds for ``candidate`` on ``gpus`` accelerators in nodes of
    ``GPUS_PER_NODE``, checked by the runtime's own placement checks (``runtime.placement_check``); a
    ``PlacementError`` naming why when the runtime refuses it. Colocated: engine i and trainer rank i share a
    device (only ``sync`` alternates them); split: trainer ranks and engines on devices of their own."""
    if candidate.train_gpus is None:
        if candidate.mode != "sync":
            raise PlacementError(f"{candidate.mode} colocated: only sync never generates while it trains")
        roles = [
            colocated_pairs(
                workers=gpus,
                engines=gpus // gpus_per_engine,
                trainer_accelerators=1.0,
                engine_accelerators=float(gpus_per_engine),
                accelerator="GPU",
            )
        ]
    else:
        engines = (gpus - candidate.train_gpus) // gpus_per_engine
        roles = [
            RoleBundles(role=TRAINER_ROLE, bundles=({"GPU": 1.0},) * candidate.train_gpus),
            RoleBundles(role=ENGINE_ROLE, bundles=({"GPU": float(gpus_per_engine)},) * engines),
        ]
    full, rest = divmod(gpus, GPUS_PER_NODE)
    nodes = [{"GPU": float(GPUS_PER_NODE)}] * full + ([{"GPU": float(rest)}] if rest else [])
    check_placement(roles, nodes)
    return layout_of(roles)


def choose(outcomes: list[Outcome], tolerance: float) -> tuple[Outcome, Outcome | None]:
    """(recommended, runner-up): the least stale of those within ``tolerance`` of the best throughput (ties:
    the faster), then the best of the rest by the same order (None when there is no other)."""
    best = max(o.samples_per_s for o in outcomes)

    def rank(o: Outcome) -> tuple[bool, float, float]:
        close = o.samples_per_s >= best * (1 - tolerance)
        return (not close, o.mean_staleness if close else 0.0, -o.samples_per_s)

    ordered = sorted(outcomes, key=rank)
    return ordered[0], ordered[1] if len(ordered) > 1 else None


def why_lost(winner: Outcome, loser: Outcome, gpus: int) -> str:
    """One line on why the runner-up was not recommended."""
    slower = 1 - loser.samples_per_s / winner.samples_per_s
    if slower > 0:
        reason = f"{slower:.1%} lower throughput"
        if loser.engine_busy < winner.engine_busy - 0.05:
            reason += f" (engines busy {loser.engine_busy:.0%} against {winner.engine_busy:.0%})"
        elif loser.trainer_busy < winner.trainer_busy - 0.05:
            reason += f" (trainer busy {loser.trainer_busy:.0%} against {winner.trainer_busy:.0%})"
        return reason
    return (
        f"{-slower:.1%} higher throughput, within the tolerance, for staler samples "
        f"(mean age {loser.mean_staleness:.2f} against {winner.mean_staleness:.2f})"
    )


def workload_from_run(run_dir: str | Path) -> list[str]:
    """Overrides describing a real run's workload: its batch shape and longest response (``config.json``),
    and lognormal lengths matching the mean and p50/p99 of its trained responses (``metrics.jsonl``, every
    step), prompt length too when the run logged it."""
    run_dir = Path(run_dir)
    config_path, metrics_path = run_dir / "config.json", run_dir / "metrics.jsonl"
    for path in (config_path, metrics_path):
        if not path.is_file():
            raise ValueError(f"--from-run {run_dir}: no {path.name} (not an asyncrl train output_dir?)")
    rollout = json.loads(config_path.read_text())["rollout"]
    rows = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    rows = [row for row in rows if "response_length/p50" in row]
    if not rows:
        raise ValueError(f"--from-run {run_dir}: metrics.jsonl has no response_length/p50 (no trained step)")
    mean = sum(row["response_length/mean"] for row in rows) / len(rows)
    p50 = sum(row["response_length/p50"] for row in rows) / len(rows)
    p99 = sum(row["response_length/p99"] for row in rows) / len(rows)
    sigma = max(0.0, math.log(max(p99, 1.0) / max(p50, 1.0)) / 2.326)  # lognormal: p99 / p50 = exp(2.326 σ)
    overrides = [
        "lengths.distribution=lognormal",
        f"lengths.mean={max(1.0, mean):.6g}",
        f"lengths.sigma={sigma:.4g}",
        f"rollout.rollout_batch_size={rollout['rollout_batch_size']}",
        f"rollout.num_return_sequences={rollout['num_return_sequences']}",
        f"rollout.max_new_tokens={rollout['max_new_tokens']}",
    ]
    prompts = [row["prompt_length/mean"] for row in rows if "prompt_length/mean" in row]
    if prompts:
        overrides.append(f"prompt_tokens={max(1, round(sum(prompts) / len(prompts)))}")
    return overrides
