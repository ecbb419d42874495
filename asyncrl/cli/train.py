"""``asyncrl train [CONFIG] [KEY=VALUE ...]``: one RL run; with no arguments, the embedded default example."""

from __future__ import annotations

import argparse
from pathlib import Path

from asyncrl.cli.args import add_config_arguments, names_no_config_file, run_config_from_args
from asyncrl.config.loader import parse_override

DEFAULT_EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "default.yaml"
"""The config ``asyncrl train`` runs when given no arguments (shipped inside the package)."""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "train",
        help="train a policy with RL",
        description="Train with RL. Without a config file, runs the default example (overrides apply to it): the shipped tiny model on "
        "the built-in long-tail counting task, evaluated on held-out prompts before and after. Metrics go to "
        "OUTPUT_DIR/metrics.jsonl, checkpoints to OUTPUT_DIR/checkpoints; resume=OUTPUT_DIR continues a run with "
        "the config it was started with (a named CONFIG.yaml replaces it).",
    )
    add_config_arguments(parser)


def run(args: argparse.Namespace) -> int:
    import asyncio

    from asyncrl.app.train import train

    resume = resumed_run(args.config_args)
    if resume is not None:  # overrides apply to the config the resumed run was started with
        from asyncrl.app.export import run_config_of

        config = run_config_of(Path(resume), args.config_args)
        print(f"resuming {resume} with the config it ran with ({config.output_dir}/config.json)", flush=True)
    else:
        if names_no_config_file(args.config_args):  # overrides apply to the default
            args.config_args = [str(DEFAULT_EXAMPLE), *args.config_args]
            print(f"running the default example {DEFAULT_EXAMPLE}", flush=True)
        config = run_config_from_args(args)
    summary = asyncio.run(_train_until_signalled(train, config))
    print(format_summary(summary))
    return 0


def resumed_run(config_args: list[str]) -> str | None:
    """The ``resume=PATH`` of arguments naming no config file, else None. Such a resume continues the run
    with the config it was started with (its ``config.json``), overrides on top: the default example would
    otherwise stand in for it, another model or task silently resumed from that run's checkpoint. A named
    CONFIG.yaml beside ``resume=`` still wins (a deliberate change of settings)."""
    if not names_no_config_file(config_args):
        return None
    resumes = [value for path, value in map(parse_override, config_args) if path == ["resume"]]
    return str(resumes[-1]) if resumes and resumes[-1] else None


async def _train_until_signalled(train, config):
    """Train; the first SIGTERM or SIGINT stops after the step in progress with a final checkpoint written
    before anything is torn down (``resume=OUTPUT_DIR`` continues); a second one interrupts at once."""
    import asyncio
    import signal

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def on_signal(signum: int) -> None:
        print(
            f"\n{signal.Signals(signum).name}: stopping after this step with a final checkpoint", flush=True
        )
        stop.set()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)  # a second signal takes the default action

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    return await train(config, stop=stop)


def format_summary(summary) -> str:
    """The closing lines of a run: held-out reward before → after, and throughput."""
    before = summary.eval_before.get("eval/reward_mean")
    after = summary.eval_after.get("eval/reward_mean")
    lines = [
        f"mode {summary.mode}: {summary.steps} steps, {summary.trained_samples} samples trained "
        f"in {summary.train_wall_s:.1f}s ({summary.trained_samples / max(summary.train_wall_s, 1e-9):.1f} "
        f"samples/s); total {summary.wall_s:.1f}s"
    ]
    busy = ", ".join(f"{phase} {seconds:.1f}s" for phase, seconds in summary.phase_busy_s.items())
    lines.append(f"busy time per phase (measured): {busy}")
    if before is not None and after is not None:
        lines.append(f"held-out reward: {before:.3f} -> {after:.3f} ({after - before:+.3f})")
    lines.append(f"metrics: {summary.metrics_path}\ncheckpoint: {summary.checkpoint}")
    return "\n".join(lines)
