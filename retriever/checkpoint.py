"""What ``--resume`` and model selection keep in a run folder.

``last.pt`` (model, its moving average if kept, optimiser, RNG, early-stopping counters; rewritten
atomically after every epoch), ``best.pt`` (weights of the best validation epoch: the average's when
kept) and ``history.jsonl``, plus the lock
that keeps one training process per folder.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from common.atomic import atomic_torch_save, write_jsonl
from retriever.config import ConfigError, RunConfig, config_from_dict
from retriever.distributed import Distributed, broadcast_bytes
from retriever.model import Retriever

log = logging.getLogger(__name__)
SELECTION_METRIC = "NDCG@10"


@dataclass
class TrainState:
    epoch: int = 0
    step: int = 0
    best_epoch: int = 0
    best_metric: float = -math.inf
    bad_evals: int = 0
    seconds: float = 0.0
    seconds_to_best: float = 0.0
    decay_start: int | None = None  # wsd: the step the decay began at, once a plateau started it
    decay_steps: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)

    def observe(self, epoch: int, metric: float, model: Retriever, run_dir: Path, elapsed: float) -> None:
        self.epoch = epoch
        if metric > self.best_metric:
            self.best_metric, self.best_epoch, self.bad_evals = metric, epoch, 0
            self.seconds_to_best = elapsed
            atomic_torch_save(model.state_dict(), run_dir / "best.pt")
        else:
            self.bad_evals += 1


def save_checkpoint(
    run_dir: Path, model: Retriever, optimizer: torch.optim.Optimizer, generator: torch.Generator,
    state: TrainState, config: RunConfig, averaged: torch.nn.Module | None = None,
) -> None:
    write_jsonl(run_dir / "history.jsonl", state.history)
    state.epoch = state.history[-1]["epoch"] if state.history else state.epoch
    atomic_torch_save({
        "model": model.state_dict(), "optimizer": optimizer.state_dict(),
        "generator": generator.get_state(), "torch_rng": torch.get_rng_state(),
        "config": config.model_dump_json(),
        "state": {k: v for k, v in vars(state).items() if k != "history"},
        "history": json.dumps(state.history),
        **({} if averaged is None else {"averaged": averaged.state_dict()}),
    }, run_dir / "last.pt")


# Settings that change how fast a run goes, not what it computes: a resumed run or search may change them.
# Settings that change nothing training computes: how fast it runs, how items added after it are served.
SPEED_ONLY = {"train": ("threads",), "model": ("added_id_weight",)}


def run_identity(raw: dict[str, Any]) -> dict[str, Any]:
    """A run config (its dump, or a raw dict) as `--resume` and `seqrec tune` match it: without the
    `SPEED_ONLY` settings (a run killed under --threads 1 resumed without it was refused, for good)."""
    identity = {section: dict(values) if isinstance(values, dict) else values for section, values in raw.items()}
    for section, keys in SPEED_ONLY.items():
        if isinstance(identity.get(section), dict):
            for key in keys:
                identity[section].pop(key, None)
    return identity


def same_run_config(stored_json: str, config: RunConfig) -> bool:
    """Whether a checkpoint's config is ``config`` (`run_identity`); keys added to the config since it was written
    count with their defaults (a field added by an upgrade must not orphan every unfinished run)."""
    try:
        stored = config_from_dict(json.loads(stored_json), source="checkpoint config")
    except ValueError:  # unreadable JSON or a config today's schema refuses (a ConfigError is a ValueError)
        return False
    return run_identity(stored.model_dump()) == run_identity(config.model_dump())


class CheckpointMismatch(ConfigError):
    """``last.pt`` holds a run of another config: it cannot be continued under this one."""


def load_checkpoint(
    run_dir: Path, model: Retriever, optimizer: torch.optim.Optimizer, generator: torch.Generator, config: RunConfig,
    dist: Distributed | None = None, averaged: torch.nn.Module | None = None,
) -> TrainState:
    """Restore ``run_dir/last.pt`` (and the weights' moving average into ``averaged``, when the run keeps one);
    under torchrun rank 0 reads the file and every rank loads its bytes."""
    path = run_dir / "last.pt"
    if dist is None:
        data = path.read_bytes() if path.exists() else None
    else:
        data = broadcast_bytes(path.read_bytes() if dist.is_main and path.exists() else None)
    if data is None:
        log.warning("--resume: no checkpoint in %s, starting from scratch", run_dir)
        return TrainState()
    saved = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    if not same_run_config(saved["config"], config):
        raise CheckpointMismatch(f"{path}: was written with a different config; resume with the same config or a new "
                                 "--out")
    model.load_state_dict(saved["model"])
    if averaged is not None:
        averaged.load_state_dict(saved["averaged"])
    optimizer.load_state_dict(saved["optimizer"])
    generator.set_state(saved["generator"])
    torch.set_rng_state(saved["torch_rng"])
    state = TrainState(**saved["state"], history=json.loads(saved["history"]))
    log.info("resumed from %s at epoch %d (best %s %.4f at epoch %d)", path, state.epoch, SELECTION_METRIC,
             state.best_metric, state.best_epoch)
    return state


@contextlib.contextmanager
def exclusive_run(run_dir: Path) -> Iterator[None]:
    """One training process per run folder; the OS drops the lock when the process dies, even by kill -9."""
    with (run_dir / ".lock").open("w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(f"{run_dir} is in use by another training process") from None
        yield


def load_weights(path: Path, model: Retriever) -> Retriever:
    model.load_state_dict(torch.load(path, map_location=next(model.parameters()).device, weights_only=True))
    return model

