"""Data-parallel training on torch.distributed: one process per device, started by torchrun.

Every process holds the whole model and trains on its own shard of the windows (a
DistributedSampler, reshuffled each epoch); DistributedDataParallel averages the gradients
during the backward pass, so the weights stay identical everywhere. Rank 0 alone validates,
writes checkpoints, TensorBoard and the artifact, and tells the others when to stop.

Collectives carry tensors only; a checkpoint travels as its file's bytes and is read back
with ``torch.load(weights_only=True)``, so nothing is pickled.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import torch
import torch.distributed
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler, TensorDataset

ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK")  # what torchrun sets for each process it starts
# The other ranks wait while rank 0 validates, and at the end scores the test split and builds the index.
WAIT = timedelta(hours=2)


@dataclass(frozen=True)
class Distributed:
    """This process's place in the job: global rank, number of processes, rank on its machine."""

    rank: int
    world_size: int
    local_rank: int

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Distributed | None:
        """The torchrun environment, or None when this process was not started by torchrun."""
        if not all(key in environ for key in ENV):
            return None
        rank, world_size, local_rank = (int(environ[key]) for key in ENV)
        return cls(rank=rank, world_size=world_size, local_rank=local_rank)


@contextlib.contextmanager
def process_group(dist: Distributed, device: torch.device) -> Iterator[None]:
    """Join the job (NCCL on CUDA, gloo on CPU; rendezvous from torchrun's MASTER_ADDR/PORT) and leave it."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    torch.distributed.init_process_group(backend, rank=dist.rank, world_size=dist.world_size, timeout=WAIT)
    try:
        yield
    finally:
        torch.distributed.destroy_process_group()


def data_parallel(objective: nn.Module, device: torch.device, probe: Tensor) -> DistributedDataParallel:
    """``objective`` (batch -> loss) wrapped so that its backward all-reduces the gradients."""
    return DistributedDataParallel(
        objective, device_ids=[device.index] if device.type == "cuda" else None,
        find_unused_parameters=_has_unused_parameters(objective, probe),
    )


def _has_unused_parameters(objective: nn.Module, batch: Tensor) -> bool:
    """Whether some parameters never reach the loss (HSTU's time bias without timestamps, for instance).

    DistributedDataParallel must then walk the autograd graph after every forward to find
    them, which costs time, so it is told only when needed. The probe leaves the weights as
    they were; the random streams it consumes are reseeded at every epoch (``reseed``).
    """
    objective.train()
    objective(batch).backward()
    unused = any(p.grad is None for p in objective.parameters() if p.requires_grad)
    objective.zero_grad(set_to_none=True)
    return unused


def shard(windows: Tensor, seed: int, epoch: int, dist: Distributed) -> Tensor:
    """This rank's windows for ``epoch``: equal shares of a seeded shuffle (the last few windows repeat)."""
    sampler: DistributedSampler[tuple[Tensor, ...]] = DistributedSampler(
        TensorDataset(windows), num_replicas=dist.world_size, rank=dist.rank, shuffle=True, seed=seed,
    )
    sampler.set_epoch(epoch)
    return windows[torch.tensor(list(sampler), device=windows.device)]


def reseed(generator: torch.Generator, seed: int, epoch: int, rank: int) -> None:
    """Seed this rank's random streams (batch order, negatives, masks, dropout) from (seed, epoch, rank).

    Ranks draw differently from one another, and a resumed run replays its epochs exactly
    without storing every rank's generator state.
    """
    loss_seed, torch_seed = np.random.SeedSequence((seed % 2**63, epoch, rank)).generate_state(2)
    generator.manual_seed(int(loss_seed))
    torch.manual_seed(int(torch_seed))


def from_main(flag: bool) -> bool:
    """Rank 0's ``flag`` on every rank (the others' values are ignored)."""
    value = torch.tensor([int(flag)], device=_device())
    torch.distributed.broadcast(value, src=0)
    return bool(value.item())


def mean_over_ranks(value: float) -> float:
    total = torch.tensor([value], dtype=torch.float64, device=_device())
    torch.distributed.all_reduce(total)
    return float(total.item()) / torch.distributed.get_world_size()


def broadcast_bytes(data: bytes | None) -> bytes | None:
    """Rank 0's ``data`` (None included) on every rank."""
    device = _device()
    size = torch.tensor([-1 if data is None else len(data)], dtype=torch.int64, device=device)
    torch.distributed.broadcast(size, src=0)
    n = int(size.item())
    if n <= 0:
        return None if n < 0 else b""
    if torch.distributed.get_rank() == 0:
        assert data is not None
        buffer = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)
    else:
        buffer = torch.empty(n, dtype=torch.uint8, device=device)
    torch.distributed.broadcast(buffer, src=0)
    return buffer.cpu().numpy().tobytes()


def _device() -> torch.device:
    """Where collectives' tensors must live: NCCL moves CUDA tensors only."""
    if torch.distributed.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
