"""The collectives of one tensor-parallel rank, on PyTorch's own process groups (gloo on the CPU,
NCCL for CUDA tensors), each with a timeout.

Two groups over one rendezvous store (a ``TCPStore`` served by rank 0)::

    control  gloo, CPU bytes      rank 0 -> all: one message per model call (forward, logits,
                                  KV-cache set-up, heartbeat, shutdown)
    device   gloo / NCCL          the model's all-reduces, the hidden rows broadcast for the
                                  LM head, the logits gathered on rank 0

The groups are built directly (``ProcessGroupGloo(store, rank, size, timeout)``), not through
``torch.distributed.init_process_group``: no process-global default group, so one process may
open and close groups (tests start several engines in one process).

A message is framed in one broadcast of ``MESSAGE_FRAME`` bytes (an int64 length, then the
payload) when it fits, which a decode step does; a longer one takes a second broadcast of the rest.
"""

from __future__ import annotations

import pickle
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (AllreduceOptions, BroadcastOptions, GatherOptions, PrefixStore,
                                        ProcessGroupGloo, ReduceOp)

from kvserve.errors import EngineDeadError

# Bytes of the fixed first broadcast of a message (length header + inline payload).
MESSAGE_FRAME = 4096
_HEADER = 8
# Seconds the ranks may take to start, meet and load their shards (spawning, importing torch and
# reading a large model take far longer than any collective); a rank that fails or exits is seen
# at once, this bounds only a rank that hangs or a node that never starts.
START_TIMEOUT = 1800.0


def make_store(host: str, port: int, rank: int, world_size: int, timeout: float) -> dist.TCPStore:
    """The rendezvous store: rank 0 serves it on ``host:port`` (port 0 = a free one, read back
    from ``store.port``), the other ranks connect to it; store operations wait up to
    ``max(timeout, START_TIMEOUT)`` seconds."""
    return dist.TCPStore(host, port, world_size, is_master=rank == 0,
                         timeout=timedelta(seconds=max(timeout, START_TIMEOUT)), wait_for_workers=False)


class Communicator:
    """Collectives among ``world_size`` ranks; every call raises ``EngineDeadError`` when a peer
    is gone or the timeout passes.

    Args:
        store: the rendezvous store (``make_store``).
        rank, world_size: this rank and the group's size.
        device: where the model's tensors live (CUDA: NCCL for the device group).
        timeout: seconds per collective (every call passes it; building the groups may take up
            to ``START_TIMEOUT``, while the other ranks start).
    """

    def __init__(self, store: dist.Store, rank: int, world_size: int, device: torch.device, timeout: float):
        self.rank = rank
        self.world_size = world_size
        self.device = device
        self.timeout = timedelta(seconds=timeout)
        connect = timedelta(seconds=max(timeout, START_TIMEOUT))
        self.control = ProcessGroupGloo(PrefixStore("control", store), rank, world_size, connect)
        if device.type == "cuda":
            from torch._C._distributed_c10d import ProcessGroupNCCL

            options = ProcessGroupNCCL.Options()
            options._timeout = self.timeout
            self.group = ProcessGroupNCCL(PrefixStore("device", store), rank, world_size, options)
        else:
            self.group = ProcessGroupGloo(PrefixStore("device", store), rank, world_size, connect)
        self._frame = torch.zeros(MESSAGE_FRAME, dtype=torch.uint8)

    # -- the model's collectives (device group) ----------------------------------------------------

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` over the ranks, in place; returns it (every rank gets the same bits).

        On the CPU a bfloat16 tensor is summed in float32 and rounded once: gloo's bfloat16 sum
        was 4x slower than its float32 one (2.7 vs 0.67 ms at 512 rows, docs/benchmarks.md
        section 5.5), and one rounding at the end is at least as exact as one per addition."""
        opts = AllreduceOptions()
        opts.reduceOp = ReduceOp.SUM
        opts.timeout = self.timeout
        if tensor.dtype == torch.bfloat16 and tensor.device.type == "cpu":
            wide = tensor.float()
            self._wait(self.group.allreduce([wide], opts), "all-reduce")
            return tensor.copy_(wide)
        self._wait(self.group.allreduce([tensor], opts), "all-reduce")
        return tensor

    def broadcast(self, tensor: torch.Tensor, timeout: timedelta | None = None) -> torch.Tensor:
        """Rank 0's ``tensor`` into every rank's (same shape and dtype), in place."""
        opts = BroadcastOptions()
        opts.rootRank = 0
        opts.rootTensor = 0
        opts.timeout = timeout or self.timeout
        self._wait(self.group.broadcast([tensor], opts), "broadcast")
        return tensor

    def gather(self, tensor: torch.Tensor) -> list[torch.Tensor] | None:
        """Every rank's ``tensor`` (same shape) on rank 0, in rank order; None on the others."""
        opts = GatherOptions()
        opts.rootRank = 0
        opts.timeout = self.timeout
        outputs = [[torch.empty_like(tensor) for _ in range(self.world_size)]] if self.rank == 0 else []
        self._wait(self.group.gather(outputs, [tensor], opts), "gather")
        return outputs[0] if self.rank == 0 else None

    # -- messages (control group) ----------------------------------------------------------------

    def send_message(self, message: Any) -> None:
        """Rank 0: broadcast ``message`` (pickled) to the other ranks."""
        payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        frame = self._frame
        frame[:_HEADER] = torch.tensor([len(payload)], dtype=torch.int64).view(torch.uint8)
        inline = payload[: MESSAGE_FRAME - _HEADER]
        frame[_HEADER : _HEADER + len(inline)] = torch.frombuffer(bytearray(inline), dtype=torch.uint8)
        self._control_broadcast(frame, self.timeout)
        if len(payload) > len(inline):
            rest = torch.frombuffer(bytearray(payload[len(inline):]), dtype=torch.uint8)
            self._control_broadcast(rest, self.timeout)

    def receive_message(self, timeout: float | None = None) -> Any:
        """The other ranks: the next message of rank 0 (waits up to ``timeout`` seconds, default
        the group's)."""
        wait = timedelta(seconds=timeout) if timeout is not None else self.timeout
        frame = self._control_broadcast(self._frame, wait)
        length = int(frame[:_HEADER].view(torch.int64)[0])
        payload = frame[_HEADER : _HEADER + min(length, MESSAGE_FRAME - _HEADER)].numpy().tobytes()
        if length > len(payload):
            rest = torch.empty(length - len(payload), dtype=torch.uint8)
            payload += self._control_broadcast(rest, self.timeout).numpy().tobytes()
        return pickle.loads(payload)

    def _control_broadcast(self, tensor: torch.Tensor, timeout: timedelta) -> torch.Tensor:
        opts = BroadcastOptions()
        opts.rootRank = 0
        opts.rootTensor = 0
        opts.timeout = timeout
        self._wait(self.control.broadcast([tensor], opts), "message broadcast")
        return tensor

    def _wait(self, work, what: str) -> None:
        try:
            work.wait()
        except Exception as exc:  # noqa: BLE001 - gloo/NCCL raise RuntimeError subclasses
            raise EngineDeadError(f"tensor-parallel rank {self.rank}: {what} failed (a peer rank died or "
                                  f"hung past --dist-timeout {self.timeout.total_seconds():g} s): {exc}") from exc

    def close(self) -> None:
        """Release the groups (peers see their connections close)."""
        for group in {id(self.control): self.control, id(self.group): self.group}.values():
            try:
                group.shutdown()
            except Exception:  # noqa: BLE001 - best effort at shutdown
                pass
