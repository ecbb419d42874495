"""How a role's thread claims its torch thread count, when several roles compute in one process.

Key decision: claim it before every unit of work (an engine step, a train step), not once when the thread
starts. torch's count is not the calling thread's alone: ``torch.set_num_threads`` also sets a process-wide
default, which a thread adopts at its first parallel op (whatever another thread set last), and MKL's GEMM
thread count, which is process-wide. Set once per thread, an engine thread with one thread and a trainer
thread with two in the same process end up with whichever count was set last, depending on start-up order:
a sync run and the same run resumed from a checkpoint then reduced sums over different thread counts and
ended with different weights. Claimed before each unit of work, a role computes with its own count whenever
the roles take turns (``sync``, behind its barrier); while they overlap (async modes in one process), they
compute with their own counts only when the counts are equal, which the placement's default shares give.
"""

from __future__ import annotations

import torch


def claim_torch_threads(num_threads: int) -> None:
    """Make the calling thread's next torch ops use ``num_threads`` threads (costs well under a microsecond)."""
    torch.set_num_threads(num_threads)
