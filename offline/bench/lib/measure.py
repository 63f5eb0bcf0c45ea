"""How big and how fast a model is: parameters, FLOPs per forward, timed inference passes, and how a cost grows.

Shared by `seqrec bench` (trained artifacts), `seqrec bench latency` (fresh models) and `seqrec bench scale`.
Every timing runs in inference mode after untimed warm-up calls, synchronising CUDA.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode

from offline.data.sequences import Sequences
from retriever.model import Retriever

FLOP_BATCH = 4  # sequences in the FLOP-count batch; counts are reported per sequence


def fit_alpha(lengths: Sequence[float], latencies: Sequence[float]) -> float:
    """Least-squares slope of log(latency) on log(length): latency ~ c * length**alpha."""
    slope, _ = np.polyfit(np.log(np.asarray(lengths, dtype=np.float64)),
                          np.log(np.asarray(latencies, dtype=np.float64)), 1)
    return float(slope)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _attention_flops(query: Sequence[int], key: Sequence[int], value: Sequence[int], *args: Any,
                     out_shape: Any = None, **kwargs: Any) -> int:
    """torch's counter knows SDPA only by its CUDA kernels; the CPU kernel does the same two matmuls."""
    batch, heads, n_queries, head_dim = query
    n_keys, value_dim = key[2], value[3]
    return 2 * batch * heads * n_queries * n_keys * (head_dim + value_dim)


def forward_flops(encoder: Callable[[Tensor], Tensor], max_len: int, n_items: int,
                  device: torch.device | None = None) -> float:
    """FLOPs (a multiply-add counts 2) of one forward of an encoder in eval mode over ``max_len`` items.

    Counted by ``torch.utils.flop_counter`` on matmuls and attention (norms, activations and
    embedding lookups are not counted), on a seeded batch of random items without padding.
    """
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1, n_items + 1, (FLOP_BATCH, max_len), generator=generator).to(device)
    cpu_attention = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _attention_flops}
    with torch.inference_mode(), FlopCounterMode(display=False, custom_mapping=cpu_attention) as counter:
        encoder(ids)
    return counter.get_total_flops() / FLOP_BATCH


def median_cpu_ms(call: Callable[[], object], reps: int) -> float:
    """Median CPU time of this thread over ``reps`` calls, in ms (4 decimals): on a shared machine wall time
    mostly measures the other jobs."""
    times = []
    for _ in range(reps):
        started = time.thread_time()
        call()
        times.append(time.thread_time() - started)
    return round(1000 * float(np.median(times)), 4)


def timed(call: Callable[[], object], *, reps: int, warmup: int, device: torch.device) -> list[float]:
    """Seconds of each of ``reps`` calls after ``warmup`` untimed ones, in inference mode."""

    def sync() -> None:
        if device.type == "cuda":  # kernels run asynchronously: time their work, not their launch
            torch.cuda.synchronize(device)

    seconds: list[float] = []
    with torch.inference_mode():
        for rep in range(warmup + reps):
            sync()
            start = time.perf_counter()
            call()
            sync()
            if rep >= warmup:
                seconds.append(time.perf_counter() - start)
    return seconds


def inference_seconds(model: Retriever, inputs: Sequences, max_len: int, batch_size: int, device: torch.device,
                      *, reps: int = 5) -> float:
    """Median time to score one fixed (seeded) batch of users against every item."""
    size = min(batch_size, len(inputs))
    rows = np.sort(np.random.default_rng(0).choice(len(inputs), size=size, replace=False))
    history = torch.from_numpy(inputs.padded(rows, max_len)).to(device)
    return statistics.median(timed(functools.partial(model.score, history), reps=reps, warmup=1, device=device))


def average_inference_steps(model: Retriever, inputs: Sequences, max_len: int, batch_size: int,
                            device: torch.device) -> float | None:
    """Mean recurrence steps per user, for encoders that halt adaptively (``last_average_steps`` is not None)."""
    encoder = model.encoder
    if encoder.last_average_steps is None:
        return None
    total = 0.0
    with torch.inference_mode():
        for start in range(0, len(inputs), batch_size):
            rows = np.arange(start, min(start + batch_size, len(inputs)))
            model.user_vectors(torch.from_numpy(inputs.padded(rows, max_len)).to(device))
            total += (encoder.last_average_steps or 0.0) * len(rows)  # the mean over this batch's users
    return round(total / max(1, len(inputs)), 3)
