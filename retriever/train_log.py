"""The training run's records: TensorBoard scalars under ``run_dir/tb/`` (rank 0), the epoch's log line and its peak
memory."""

from __future__ import annotations

import contextlib
import logging
import resource
import sys
from pathlib import Path
from typing import Any

import torch

from retriever.checkpoint import SELECTION_METRIC

log = logging.getLogger("retriever.train")  # the epoch lines keep the logger they always had


def peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return round(torch.cuda.max_memory_allocated(device) / 2**20, 1)
    rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kilobytes on Linux, bytes on macOS
    return round(rss_kb / (2**20 if sys.platform == "darwin" else 2**10), 1)


def log_epoch(writer: Any, record: dict[str, Any], device: torch.device) -> None:
    epoch = record["epoch"]
    for key in ("loss", "epoch_seconds", "sequences_per_second", "peak_memory_mb"):
        writer.add_scalar(f"epoch/{key}", record[key], epoch)
    for name, value in record.get("valid", {}).items():
        writer.add_scalar(f"valid/{name}", value, epoch)
    if device.type == "cuda":
        with contextlib.suppress(RuntimeError, ModuleNotFoundError):  # needs pynvml; not worth failing a run over
            writer.add_scalar("epoch/gpu_utilization", torch.cuda.utilization(device), epoch)
    writer.flush()
    valid = record.get("valid", {})
    log.info("epoch %d loss %.4f %s %.4f %.0f seq/s %.1fs", epoch, record["loss"], SELECTION_METRIC,
             valid.get(SELECTION_METRIC, float("nan")), record["sequences_per_second"], record["epoch_seconds"])


class NoWriter:
    """The TensorBoard writer of ranks other than 0, which write nothing."""

    def add_scalar(self, *args: Any) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def tensorboard(run_dir: Path) -> Any:
    from torch.utils.tensorboard import SummaryWriter  # slow import; only when training

    return SummaryWriter(log_dir=str(run_dir / "tb"))
