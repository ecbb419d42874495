"""Benchmark: the OpenAI-compatible endpoint under load. 8 → 128 concurrent multi-turn sessions, each driven by the
official ``openai`` client against ``asyncrl serve`` (the shipped tiny model, 127.0.0.1), then load dropped.

Workload (fixed before any arm ran): a session is one named trajectory of ``TURNS`` chat turns (each a copy
prompt of 3 words, ``max_tokens`` 12, temperature 1, seeded), finished with reward 0 (or aborted if a call was
refused mid-way). Clients never retry (``max_retries=0``), so every refusal is counted. The server runs with
``--max-concurrent-calls BOUND`` (64): the levels 8, 16, 32 and 64 sessions are within it (target: no error,
no refusal), 128 is above it (target: the overflow answered 429 with ``Retry-After`` at once, nothing else
failing), and right after the 128 level 8 sessions run again (``recovery_*``, target: no refusal: the server
serves again as soon as load drops). A level runs ``SESSIONS`` sessions or ``TIME_BOUND_S``, whichever ends
first. Each level is an arm; arms interleave, ≥ 3 repeats, one server for the whole benchmark.

Metrics per run: calls/s, sessions/s, generated tokens/s, p50/p99 latency of the calls served, ``errors``
(anything but a 429), ``refused`` (429), ``refused_without_retry_after``, and the server's peak RSS (sampled
every 50 ms). The server and the clients get disjoint cores where the machine has two or more.

    python bench/serve_load.py [--quick] [--repeats 3] [--out bench/results/serve_load.json]

The full run needs a quiet machine (latency is the point); ``--quick`` (seconds, 2 and 8 sessions over a bound
of 4) is what the test suite runs.
"""

from __future__ import annotations

import sys
from pathlib import Path

# `python bench/serve_load.py` puts bench/ first on sys.path: make the checkout the import root, as `python -m` would
if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import asyncio
import contextlib
import itertools
import os
import queue
import random
import statistics
import subprocess
import threading
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
import psutil

from bench import harness

LEVELS = (8, 16, 32, 64, 128)
BOUND = 64
SESSIONS = 256
TIME_BOUND_S = 30.0
TURNS = 3
MAX_TOKENS = 12
RECOVERY_LEVEL = 8
QUICK = {"levels": (2, 8), "bound": 4, "sessions": 8, "time_bound_s": 15.0, "turns": 2, "recovery": 2}
WORDS = [
    "apple",
    "bird",
    "cloud",
    "dune",
    "echo",
    "fern",
    "gold",
    "hill",
    "iris",
    "jade",
    "kite",
    "lamp",
    "moss",
    "nest",
    "opal",
    "pine",
]
SERVER_START_S = 120.0


@dataclass
class Tally:
    """What one level's sessions saw."""

    latencies_s: list[float] = field(default_factory=list)
    tokens: int = 0
    sessions: int = 0
    errors: int = 0
    refused: int = 0
    refused_without_retry_after: int = 0


class Server:
    """``asyncrl serve`` as a user starts it, on its own cores, and its peak RSS sampled in the background."""

    def __init__(self, bound: int, cores: list[int]) -> None:
        command = [
            sys.executable,
            "-m",
            "asyncrl.cli.main",
            "serve",
            "tiny-copy",
            "--port",
            "0",
            "--chat-format",
            "plain",
            "--device",
            "cpu",
            "--max-concurrent-calls",
            str(bound),
        ]
        env = {**os.environ, "OMP_NUM_THREADS": str(len(cores)), "HF_HUB_OFFLINE": "1"}
        self.process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            preexec_fn=lambda: os.sched_setaffinity(0, cores),
        )
        self.url = self._read_url()
        self.peak_rss = 0
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def _read_url(self) -> str:
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(
            target=lambda: [lines.put(line) for line in self.process.stdout], daemon=True
        ).start()
        deadline = time.monotonic() + SERVER_START_S
        while time.monotonic() < deadline:
            with contextlib.suppress(queue.Empty):
                line = lines.get(timeout=0.5)
                if line.startswith("serving "):
                    return line.split(" on ")[1].split()[0].removesuffix("/v1")
            if self.process.poll() is not None:
                break
        self.close()
        raise RuntimeError(f"asyncrl serve did not start within {SERVER_START_S} s")

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            with contextlib.suppress(psutil.Error):
                process = psutil.Process(self.process.pid)
                rss = process.memory_info().rss + sum(c.memory_info().rss for c in process.children(True))
                self.peak_rss = max(self.peak_rss, rss)

    def take_peak_rss(self) -> int:
        peak, self.peak_rss = self.peak_rss, 0
        return peak

    def close(self) -> None:
        self._stop.set()
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()


async def session(root: str, name: str, http: httpx.AsyncClient, tally: Tally, turns: int, seed: int) -> None:
    """One trajectory of ``turns`` turns; a refused or failed call ends it (aborted, so it is not left live)."""
    client = openai.AsyncOpenAI(
        base_url=f"{root}/trajectories/{name}/v1", api_key="-", max_retries=0, http_client=http
    )
    rng, messages, served = random.Random(seed), [], 0
    for turn in range(turns):
        messages.append({"role": "user", "content": "copy " + " ".join(rng.sample(WORDS, 3)) + ":"})
        started = time.perf_counter()
        try:
            answer = await client.chat.completions.create(
                model="asyncrl-policy", messages=messages, max_tokens=MAX_TOKENS, seed=seed * 100 + turn
            )
        except openai.RateLimitError as refused:
            tally.refused += 1
            tally.refused_without_retry_after += "retry-after" not in refused.response.headers
            break
        except (openai.APIError, httpx.HTTPError):
            tally.errors += 1
            break
        tally.latencies_s.append(time.perf_counter() - started)
        tally.tokens += answer.usage.completion_tokens
        messages.append(answer.choices[0].message.model_dump(exclude_none=True))
        served += 1
    ending = "finish" if served == turns else "abort"
    if served:
        body = {"reward": 0.0} if ending == "finish" else {"reason": "a call was refused"}
        response = await http.post(f"{root}/trajectories/{name}/{ending}", json=body)
        tally.errors += response.status_code != 200
    tally.sessions += served == turns


async def level(
    root: str, concurrency: int, cap: int, time_bound_s: float, turns: int, names: Iterator[str]
) -> Tally:
    """``concurrency`` workers running sessions back to back until ``cap`` sessions started or the time bound."""
    tally, started = Tally(), itertools.count()
    deadline = time.monotonic() + time_bound_s
    limits = httpx.Limits(max_connections=concurrency * 2, max_keepalive_connections=concurrency * 2)
    async with openai.DefaultAsyncHttpxClient(limits=limits, timeout=120) as http:

        async def worker() -> None:
            while next(started) < cap and time.monotonic() < deadline:
                name = next(names)
                await session(root, name, http, tally, turns, seed=zlib.crc32(name.encode()))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return tally


def metrics(tally: Tally, wall_s: float) -> dict[str, float]:
    lat = sorted(tally.latencies_s) or [float("nan")]
    p99 = lat[max(0, min(len(lat) - 1, round(0.99 * len(lat)) - 1))]
    return {
        "calls_per_s": len(tally.latencies_s) / wall_s,
        "sessions_per_s": tally.sessions / wall_s,
        "tokens_per_s": tally.tokens / wall_s,
        "latency_p50_s": statistics.median(lat),
        "latency_p99_s": p99,
        "errors": float(tally.errors),
        "refused": float(tally.refused),
        "refused_without_retry_after": float(tally.refused_without_retry_after),
        "sessions": float(tally.sessions),
    }


def make_arm(server: Server, concurrency: int, setup: dict[str, Any], names: Iterator[str], recover: bool):
    """One level; the top one also runs the recovery level right after it (its ``recovery_*`` metrics)."""

    def arm() -> dict[str, float]:
        server.take_peak_rss()
        started = time.perf_counter()
        tally = asyncio.run(
            level(server.url, concurrency, setup["sessions"], setup["time_bound_s"], setup["turns"], names)
        )
        result = metrics(tally, time.perf_counter() - started) | {
            "rss_mib_peak": server.take_peak_rss() / 2**20
        }
        if recover:
            after = asyncio.run(
                level(
                    server.url,
                    setup["recovery"],
                    setup["sessions"],
                    setup["time_bound_s"],
                    setup["turns"],
                    names,
                )
            )
            result |= {"recovery_refused": float(after.refused), "recovery_errors": float(after.errors)}
        return result

    return arm


def cores() -> tuple[list[int], list[int]]:
    """(server cores, client cores): disjoint where there are two or more."""
    usable = sorted(os.sched_getaffinity(0))
    if len(usable) < 2:
        return usable, usable
    return usable[:-1], usable[-1:]


def main() -> int:
    args = harness.parser(__doc__.splitlines()[0], "serve_load").parse_args()
    repeats = harness.repeats_for(args)
    setup = (
        dict(QUICK)
        if args.quick
        else {
            "levels": LEVELS,
            "bound": BOUND,
            "sessions": SESSIONS,
            "time_bound_s": TIME_BOUND_S,
            "turns": TURNS,
            "recovery": RECOVERY_LEVEL,
        }
    )
    setup |= {"max_tokens": MAX_TOKENS, "model": "tiny-copy (asyncrl/assets)", "chat_format": "plain"}
    server_cores, client_cores = cores()
    os.sched_setaffinity(0, client_cores)
    server = Server(setup["bound"], server_cores)
    names = (f"s{i}" for i in itertools.count())
    try:
        top = max(setup["levels"])
        arms = {f"c{n}": make_arm(server, n, setup, names, recover=n == top) for n in setup["levels"]}
        raw = harness.run_arms(arms, repeats, harness.print_run)
    finally:
        server.close()
    harness.write_result(
        args,
        "serve_load",
        raw,
        resources={
            "server": {"cores": server_cores, "torch_threads": len(server_cores), "engine_slots": 64},
            "clients": {"cores": client_cores, "process": "this one, one asyncio loop"},
        },
        setup=setup,
        extra={
            "targets": {
                "within_bound": "errors = refused = 0 at every level <= bound",
                "above_bound": "refused > 0, refused_without_retry_after = errors = 0",
                "recovery": "recovery_refused = recovery_errors = 0",
            }
        },
    )
    print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
