"""Each tensor-parallel rank of a machine on its own CPU cores.

Ranks on one machine share its cores: without a plan, N ranks of ``T`` threads each oversubscribe
the cores and every all-reduce waits for a descheduled thread (docs/benchmarks.md measured
14-30x slower decode under such contention). The cores this process may use
(``os.sched_getaffinity``: ``taskset``, ``numactl --physcpubind``, ``docker --cpuset-cpus``) are
split in ``N`` contiguous, equal runs in core-id order; local rank ``i`` runs on run ``i`` with
as many threads (``torch.set_num_threads``). On a two-socket server, core ids usually number one
socket then the other, so ``-tp 4`` gives two ranks per NUMA node; check with ``lscpu`` and start
the server under ``numactl`` (docs/tensor_parallelism.md).
"""

from __future__ import annotations

import os


def split_cores(num_ranks: int, cores: list[int] | None = None) -> list[tuple[int, ...]] | None:
    """``num_ranks`` runs of this process's cores (or of ``cores``), or None when there are
    fewer cores than ranks (then nothing is pinned)."""
    available = sorted(os.sched_getaffinity(0) if cores is None else cores)
    if len(available) < num_ranks:
        return None
    per_rank = len(available) // num_ranks
    return [tuple(available[i * per_rank : (i + 1) * per_rank]) for i in range(num_ranks)]


def pin_current_thread(cores: tuple[int, ...]) -> tuple[set[int], int]:
    """Run the calling thread (and the threads it starts later) on ``cores`` with that many
    torch threads. Returns the previous (affinity, thread count), for :func:`unpin`."""
    import torch

    previous = (os.sched_getaffinity(0), torch.get_num_threads())
    os.sched_setaffinity(0, cores)
    torch.set_num_threads(len(cores))
    return previous


def unpin(previous: tuple[set[int], int]) -> None:
    import torch

    os.sched_setaffinity(0, previous[0])
    torch.set_num_threads(previous[1])
