"""Joining the trainer ranks into one ``torch.distributed`` process group: backend by device, a TCP rendezvous.

Rank 0 picks the rendezvous (its node's address and a free port) and every rank is told it, so no fixed port is
ever assumed and two runs on one machine never collide. The backend follows the device: gloo on CPU, NCCL on
CUDA (the same trainer code runs on both; only this choice differs).
"""

from __future__ import annotations

import socket
from datetime import timedelta

import torch
import torch.distributed as dist

BACKENDS = {"cpu": "gloo", "cuda": "nccl"}


def backend_for(device: str) -> str:
    """The collective backend of a model on ``device`` (``cpu``, ``cuda``, ``cuda:1``)."""
    kind = torch.device(device).type
    if kind not in BACKENDS:
        raise ValueError(f"no torch.distributed backend for device {device!r} (known: {sorted(BACKENDS)})")
    return BACKENDS[kind]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now (the OS picks it), for rank 0's rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def join_process_group(
    *, device: str, host: str, port: int, rank: int, world_size: int, timeout_s: float = 300.0
) -> None:
    """Join the group rendezvousing at ``host:port`` as ``rank`` of ``world_size`` (blocks until all joined).

    ``timeout_s`` bounds the rendezvous and every later collective, so a dead rank fails the others' calls
    instead of hanging them forever.
    """
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device).index or 0)
    dist.init_process_group(
        backend_for(device),
        init_method=f"tcp://{host}:{port}",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
    )


def leave_process_group() -> None:
    """Destroy this process's group if it has one (idempotent)."""
    if dist.is_initialized():
        dist.destroy_process_group()
