"""Progress of a long loop (training steps, SFT steps, evaluation batches, sweep points) for a person watching.

Key decision: on a terminal a tqdm bar redraws in place with the rate, the few numbers that matter and an
ETA; anywhere else (a pipe, a CI log, a file) every update is one plain line with the same numbers, because
carriage-return redraws turn a log into noise. Libraries' own bars (Hugging Face's "Loading weights", "Writing
model shards", dataset maps) follow the same rule: ``library_bars_follow_terminal``.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from typing import Literal, TextIO

ProgressMode = Literal["auto", "bar", "lines"]


class Progress:
    """``done/total`` of one loop with named numbers; ``update`` after each unit, ``close`` at the end."""

    def __init__(
        self,
        total: int,
        *,
        label: str,
        stream: TextIO | None = None,
        mode: ProgressMode = "auto",
        unit: str = "step",
        min_interval_s: float = 0.0,
    ) -> None:
        """``min_interval_s`` spaces plain lines out (the last unit is always printed); bars throttle
        themselves."""
        self.total = total
        self.label = label
        self.stream = sys.stdout if stream is None else stream
        self.unit = unit
        self.min_interval_s = min_interval_s
        self._started = time.perf_counter()
        self._last_line = float("-inf")
        self._bar = self._make_bar() if _wants_bar(mode, self.stream) else None

    def update(self, done: int, numbers: Mapping[str, float] | None = None) -> None:
        """Report that ``done`` of ``total`` units are finished, with ``numbers`` shown beside."""
        shown = {k: _short(v) for k, v in (numbers or {}).items()}
        if self._bar is not None:
            self._bar.set_postfix(shown, refresh=False)
            self._bar.update(done - self._bar.n)
            return
        now = time.perf_counter()
        if done < self.total and now - self._last_line < self.min_interval_s:
            return
        self._last_line = now
        eta = self.eta_s(done)
        parts = [f"{k}={v}" for k, v in shown.items()]
        if eta is not None:
            parts.append(f"eta={_duration(eta)}")
        print(f"[{self.label} {done}/{self.total}] {'  '.join(parts)}".rstrip(), file=self.stream, flush=True)

    def eta_s(self, done: int) -> float | None:
        """Seconds left at the mean pace so far (None before the first unit or after the last)."""
        if done <= 0 or done >= self.total:
            return None
        return (time.perf_counter() - self._started) / done * (self.total - done)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()

    def _make_bar(self):
        from tqdm import tqdm

        return tqdm(total=self.total, desc=self.label, unit=self.unit, file=self.stream, dynamic_ncols=True)


LIBRARY_BARS = (
    ("HF_HUB_DISABLE_PROGRESS_BARS", "huggingface_hub.utils", "disable_progress_bars"),
    ("HF_HUB_DISABLE_PROGRESS_BARS", "transformers.utils.logging", "disable_progress_bar"),
    ("HF_DATASETS_DISABLE_PROGRESS_BARS", "datasets.utils.tqdm", "disable_progress_bars"),
)
"""(environment switch the library reads when imported, its module, the function that switches it off once it
is imported) for each library that draws its own tqdm bars: huggingface_hub, transformers, datasets."""


def library_bars_follow_terminal(stream: TextIO | None = None) -> None:
    """Turn off Hugging Face's own progress bars unless ``stream`` (where they draw: stderr) is a terminal.

    Call it where a process starts (the ``asyncrl`` command, a benchmark), best before those libraries load:
    the switches go into the environment, so Ray workers and subprocesses started later follow them too, and
    a library already imported is switched off in place. A switch the user set is left as it is.
    """
    if _is_terminal(sys.stderr if stream is None else stream):
        return
    for switch, module, switch_off in LIBRARY_BARS:
        if os.environ.setdefault(switch, "1") == "1" and module in sys.modules:
            getattr(sys.modules[module], switch_off)()


def _wants_bar(mode: ProgressMode, stream: TextIO) -> bool:
    if mode not in ("auto", "bar", "lines"):
        raise ValueError(f"progress mode must be 'auto', 'bar' or 'lines', got {mode!r}")
    if mode == "auto":
        return _is_terminal(stream)
    return mode == "bar"


def _is_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def _short(value: float) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"
