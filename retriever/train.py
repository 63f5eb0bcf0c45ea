"""The retriever's training loop: short and linear, built from named helpers.

Data arrives as CSR arrays of training positions only (no validation or test item), cut into
windows by retriever/windows.py, and validation is a callback, so this module knows nothing
about files or splits. Every position of every window is trained at once (causal), not one
prefix per sample, unless the encoder's states are not causal (``train.windows: prefixes``).
What ``--resume`` needs lives in the run folder (retriever/checkpoint.py); TensorBoard event
files go under ``run_dir/tb/``.

Under torchrun (``dist`` given) every process trains its own shard of each epoch's windows
with ``batch_size / world_size`` windows per step, so the global batch and the steps per
epoch match one process; only rank 0 validates and writes anything (retriever/distributed.py).
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from tqdm import tqdm

from common.atomic import atomic_write
from retriever.averaging import averaged_copy
from retriever.checkpoint import (
    SELECTION_METRIC,
    TrainState,
    exclusive_run,
    load_checkpoint,
    load_weights,
    save_checkpoint,
)
from retriever.config import ConfigError, RunConfig
from retriever.distributed import Distributed, data_parallel, from_main, mean_over_ranks, reseed, shard
from retriever.losses import BCE_NEEDS, LossContext, compute_loss, item_log_prob
from retriever.model import Retriever
from retriever.train_log import NoWriter, log_epoch, peak_memory_mb, tensorboard
from retriever.windows import batches, make_windows

log = logging.getLogger(__name__)

Validate = Callable[[Retriever], dict[str, float]]


@dataclass
class FitResult:
    model: Retriever
    best_epoch: int
    best_metric: float
    history: list[dict[str, Any]] = field(default_factory=list)
    seconds_to_best: float = 0.0
    seconds: float = 0.0
    sequences_per_second: float = 0.0


@dataclass(frozen=True)
class TrainingRun:
    """What every epoch of one ``fit`` shares; built once, before the first epoch.

    objective: ``BatchLoss`` over ``model`` (wrapped in DistributedDataParallel under torchrun);
    ctx.generator draws batches and negatives and is saved with every checkpoint.
    """

    config: RunConfig
    model: Retriever
    objective: nn.Module
    optimizer: torch.optim.Optimizer
    ctx: LossContext
    run_dir: Path
    dist: Distributed | None = None
    progress: bool = True
    averaged: nn.Module | None = None  # train.ema_epochs: the moving average of ``model`` (an AveragedModel)

    @property
    def evaluated(self) -> Retriever:
        """The weights validation, early stopping and best.pt read: the moving average when the run keeps one."""
        return self.model if self.averaged is None else self.averaged.module  # type: ignore[return-value]

    @property
    def main(self) -> bool:
        """Whether this process validates and writes (always, unless a torchrun rank other than 0)."""
        return self.dist is None or self.dist.is_main

    @property
    def generator(self) -> torch.Generator:
        assert self.ctx.generator is not None  # fit always builds the context with one
        return self.ctx.generator


def lr_at(step: int, total_steps: int, config: RunConfig, decay: tuple[int, int] | None = None) -> float:
    """The lr of optimiser step ``step`` (0-based); ``decay`` = (first step, length) of wsd's decay once begun."""
    train = config.train
    if train.warmup_steps and step < train.warmup_steps:
        return train.lr * (step + 1) / train.warmup_steps
    if train.schedule == "cosine":
        progress = (step - train.warmup_steps) / max(1, total_steps - train.warmup_steps)
        return train.lr * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    if train.schedule == "wsd" and decay is not None and step >= decay[0]:
        # Linear to the floor, reached on the decay's last step.
        remaining = 1.0 - min(1.0, (step - decay[0] + 1) / max(1, decay[1]))
        return train.lr * (train.lr_floor + (1.0 - train.lr_floor) * remaining)
    return train.lr


def resolve_device(config: RunConfig, local_rank: int | None = None) -> torch.device:
    """The training device; under torchrun, CUDA means this process's own GPU, cuda:LOCAL_RANK."""
    wanted = config.train.device
    if wanted == "cuda" and not torch.cuda.is_available():
        raise ConfigError("train.device=cuda but torch sees no CUDA device")
    if wanted == "auto":
        wanted = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(wanted)
    if device.type == "cuda":
        if local_rank is not None:
            device = torch.device("cuda", local_rank)
            torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    elif config.train.threads:
        torch.set_num_threads(config.train.threads)
    return device


class BatchLoss(nn.Module):
    """The whole objective of a (B, T + 1) window batch in one forward.

    One forward that uses every parameter (the item table outside ``hidden`` included) is
    what DistributedDataParallel needs to all-reduce every gradient. Two encoder hooks keep
    model-specific objectives out of the loop (retriever/backbones/base.py): ``training_inputs``
    replaces the next-item shift (BERT4Rec's cloze masking), and ``auxiliary_loss`` returns a
    term added after the forward (a ponder cost).
    """

    def __init__(self, model: Retriever, config: RunConfig, ctx: LossContext) -> None:
        super().__init__()
        self.model, self.config, self.ctx = model, config, ctx

    def forward(self, batch: Tensor) -> Tensor:
        model, loss_config = self.model, self.config.loss
        inputs, targets, trained = model.encoder.training_inputs(batch, self.ctx.generator)
        if self.config.train.windows == "prefixes":  # one target per window: its last position
            trained = trained & (torch.arange(trained.shape[1], device=trained.device) == trained.shape[1] - 1)
        with torch.autocast(batch.device.type, dtype=torch.bfloat16, enabled=batch.device.type == "cuda"):
            hidden = model.hidden(inputs)  # (B, T, D)
        loss = compute_loss(
            loss_config.name, hidden[trained].float(), targets[trained], model.encoder.item_embeddings(), self.ctx,
            logq=loss_config.logq, n_uniform=loss_config.n_uniform, n_negatives=loss_config.n_negatives,
        )
        auxiliary = model.encoder.auxiliary_loss()
        if auxiliary is not None:
            loss = loss + auxiliary
        return loss


def train_step(
    model: Retriever, batch: Tensor, optimizer: torch.optim.Optimizer, config: RunConfig, ctx: LossContext,
    *, objective: nn.Module | None = None,
) -> tuple[float, float]:
    """One optimiser step on a (B, T + 1) window batch; returns (loss, grad norm).

    ``objective`` is ``BatchLoss(model, config, ctx)`` (built here when not given), or the
    same wrapped in DistributedDataParallel, whose backward all-reduces the gradients.
    """
    loss = (objective if objective is not None else BatchLoss(model, config, ctx))(batch)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    clip = config.train.grad_clip if config.train.grad_clip is not None else math.inf
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    optimizer.step()
    return float(loss.detach()), float(grad_norm)


def make_optimizer(model: Retriever, config: RunConfig) -> torch.optim.Optimizer:
    # Norm gains and embeddings are not decayed (decay on them only shrinks scale, cf. nanoGPT).
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "emb" not in n]
    rest = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "emb" not in n)]
    groups = [{"params": decay, "weight_decay": config.train.weight_decay}, {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=config.train.lr, betas=config.train.betas)


def fit(
    config: RunConfig,
    train_offsets: np.ndarray,
    train_items: np.ndarray,
    n_items: int,
    validate: Validate,
    run_dir: Path,
    *,
    resume: bool = False,
    progress: bool = True,
    item_features: Tensor | None = None,
    dist: Distributed | None = None,
    init: Callable[[Retriever], Any] | None = None,
    run_files: Mapping[str, str] | None = None,
) -> FitResult:
    """Train with early stopping on ``validate(model)[SELECTION_METRIC]``; returns the best model.

    item_features: (n_items + 1, F) side-feature ids for encoders that take them (config n_features > 0).
    dist: this process's place in a torchrun job (process group already joined); ``validate``
    runs on rank 0 only, and the other ranks get back their last weights, not the best.
    init: called with the freshly built model before training (a warm start writes its weights).
    run_files: name -> text written into ``run_dir`` once the model is built (a run that fails before writes none).
    """
    device = resolve_device(config, None if dist is None else dist.local_rank)
    torch.manual_seed(config.train.seed)
    model = config.build(n_items)
    if item_features is not None:
        model.encoder.set_item_features(item_features)
    if init is not None:
        init(model)
    model = model.to(device)
    max_len = config.max_len(n_items)
    windows = torch.from_numpy(make_windows(train_offsets, train_items, max_len, config.train.windows)).to(device)
    if len(windows) == 0:
        raise ConfigError("no training sequence has two or more items")
    if config.loss.name == "bce" and n_items < 2:  # before run_dir exists (the loss itself would fail at step 1)
        raise ConfigError(BCE_NEEDS.format(n_items=n_items))
    optimizer = make_optimizer(model, config)
    generator = torch.Generator(device=device).manual_seed(config.train.seed)
    ctx = LossContext(
        temperature=model.temperature, project=model._project, generator=generator,
        item_log_prob=item_log_prob(torch.from_numpy(train_items), n_items).to(device),
    )
    objective: nn.Module = BatchLoss(model, config, ctx)
    if dist is not None:
        if config.train.batch_size % dist.world_size:
            raise ConfigError(f"train.batch_size={config.train.batch_size} must be divisible by the "
                              f"{dist.world_size} processes (each trains batch_size / processes windows a step)")
        objective = data_parallel(objective, device, windows[: config.train.batch_size // dist.world_size])
    averaged = averaged_copy(model, config, steps_per_epoch=-(-len(windows) // config.train.batch_size))
    run = TrainingRun(config, model, objective, optimizer, ctx, run_dir, dist, progress, averaged)
    if run.main:
        run_dir.mkdir(parents=True, exist_ok=True)
    with exclusive_run(run_dir) if run.main else contextlib.nullcontext():
        for name, text in (run_files or {}).items() if run.main else ():
            atomic_write(run_dir / name, lambda tmp, text=text: tmp.write_text(text))  # type: ignore[misc]
        return _fit_locked(run, windows, validate, resume)


def _fit_locked(run: TrainingRun, windows: Tensor, validate: Validate, resume: bool) -> FitResult:
    config, model, run_dir = run.config, run.model, run.run_dir
    state = (load_checkpoint(run_dir, model, run.optimizer, run.generator, config, run.dist, run.averaged)
             if resume else TrainState())
    steps_per_epoch = -(-len(windows) // config.train.batch_size)
    total_steps = steps_per_epoch * config.train.epochs
    device = windows.device
    writer = tensorboard(run_dir) if run.main else NoWriter()
    log.info("training %s on %d windows (%d steps/epoch) on %s", config.model.backbone, len(windows),
             steps_per_epoch, device)
    started = time.perf_counter() - state.seconds
    for epoch in range(state.epoch + 1, config.train.epochs + 1):
        if state.bad_evals >= config.train.patience or out_of_time(config, state.seconds) or decay_done(state):
            break  # a resumed run that had ended
        record = run_epoch(run, windows, state, writer, total_steps, epoch)
        last_epoch = epoch == config.train.epochs or out_of_time(config, time.perf_counter() - started)
        if run.main:
            if epoch % config.train.eval_every == 0 or last_epoch:
                run.evaluated.eval()
                metrics = validate(run.evaluated)
                record["valid"] = metrics
                state.observe(epoch, metrics[SELECTION_METRIC], run.evaluated, run_dir, time.perf_counter() - started)
            state.seconds = time.perf_counter() - started
            state.history.append(record)
            log_epoch(writer, record, device)
        if config.train.schedule == "wsd" and state.decay_start is None:
            plateau = run.main and state.bad_evals >= config.train.decay_patience
            if plateau if run.dist is None else from_main(plateau):
                start_decay(state, epoch, steps_per_epoch, config)
        if run.main:
            save_checkpoint(run_dir, model, run.optimizer, run.generator, state, config, run.averaged)
        stop = run.main and _stops_after(config, state, epoch, last_epoch)
        if stop if run.dist is None else from_main(stop):  # every rank leaves the loop at rank 0's epoch
            break
    writer.close()
    best = load_weights(run_dir / "best.pt", model) if run.main and (run_dir / "best.pt").exists() else model
    best.eval()
    return _result(best, state)


def _result(best: Retriever, state: TrainState) -> FitResult:
    total_sequences = sum(r["sequences_per_second"] * r["epoch_seconds"] for r in state.history)
    train_seconds = sum(r["epoch_seconds"] for r in state.history)
    return FitResult(
        model=best, best_epoch=state.best_epoch, best_metric=state.best_metric, history=state.history,
        seconds_to_best=state.seconds_to_best, seconds=state.seconds,
        sequences_per_second=round(total_sequences / max(1e-9, train_seconds), 1),
    )


def start_decay(state: TrainState, epoch: int, steps_per_epoch: int, config: RunConfig) -> None:
    """wsd: the validation plateau starts the decay now; it lasts decay_fraction of the epochs run (rounded up)."""
    state.decay_start = state.step
    state.decay_steps = math.ceil(config.train.decay_fraction * epoch) * steps_per_epoch
    log.info("epoch %d: no %s gain for %d validations, lr decays over the next %d steps", epoch, SELECTION_METRIC,
             config.train.decay_patience, state.decay_steps)


def decay_done(state: TrainState) -> bool:
    """Whether wsd's decay has begun and reached its last step (training ends there)."""
    return state.decay_start is not None and state.step >= state.decay_start + state.decay_steps


def _stops_after(config: RunConfig, state: TrainState, epoch: int, last_epoch: bool) -> bool:
    if decay_done(state):
        log.info("lr decay ended at epoch %d", epoch)
        return True
    if state.bad_evals >= config.train.patience:
        log.info("early stop at epoch %d: no %s gain for %d validations", epoch, SELECTION_METRIC,
                 config.train.patience)
        return True
    if epoch < config.train.epochs and (last_epoch or out_of_time(config, state.seconds)):
        log.info("time budget of %g min used up at epoch %d", config.train.budget_minutes, epoch)
        return True
    return False


def out_of_time(config: RunConfig, elapsed_seconds: float) -> bool:
    """Whether the run's wall-clock budget (train.budget_minutes; resumed time included) is spent."""
    budget = config.train.budget_minutes
    return budget is not None and elapsed_seconds >= 60 * budget
def run_epoch(
    run: TrainingRun, windows: Tensor, state: TrainState, writer: Any, total_steps: int, epoch: int
) -> dict[str, Any]:
    """One pass over the shuffled windows (this rank's shard of them); returns the epoch's record.

    The record holds the loss, lr, speed and memory; under torchrun the loss is the mean over
    ranks and the speed counts every rank's windows.
    """
    config, dist = run.config, run.dist
    run.objective.train()
    batch_size, world_size = config.train.batch_size, 1
    if dist is not None:
        reseed(run.generator, config.train.seed, epoch, dist.rank)
        windows = shard(windows, config.train.seed, epoch, dist)
        batch_size, world_size = batch_size // dist.world_size, dist.world_size
    steps = -(-len(windows) // batch_size)
    epoch_start = time.perf_counter()
    losses: list[float] = []
    n_sequences = 0
    decay = None if state.decay_start is None else (state.decay_start, state.decay_steps)
    lr = lr_at(state.step, total_steps, config, decay)
    bar = tqdm(batches(windows, batch_size, run.generator), total=steps, desc=f"epoch {epoch}",
               unit="batch", disable=not (run.progress and run.main) or None, leave=False)
    for batch in bar:
        lr = lr_at(state.step, total_steps, config, decay)
        for group in run.optimizer.param_groups:
            group["lr"] = lr
        loss, grad_norm = train_step(run.model, batch, run.optimizer, config, run.ctx, objective=run.objective)
        if run.averaged is not None:
            run.averaged.update_parameters(run.model)  # type: ignore[operator]
        if dist is not None:
            loss = mean_over_ranks(loss)
        if not math.isfinite(loss):  # every later step and every score would be NaN too
            raise ConfigError(f"training diverged: the loss is {loss} at epoch {epoch}, step {state.step + 1}; "
                              f"lower train.lr ({config.train.lr:g})")
        losses.append(loss)
        n_sequences += len(batch) * world_size
        state.step += 1
        bar.set_postfix(loss=f"{loss:.4f}", seq_s=f"{n_sequences / max(1e-9, time.perf_counter() - epoch_start):.0f}")
        for name, value in (("loss", loss), ("lr", lr), ("grad_norm", grad_norm)):
            writer.add_scalar(f"train/{name}", value, state.step)
    seconds = time.perf_counter() - epoch_start
    return {
        "epoch": epoch, "step": state.step, "loss": float(np.mean(losses)), "lr": lr,
        "epoch_seconds": round(seconds, 3), "sequences_per_second": round(n_sequences / seconds, 1),
        "peak_memory_mb": peak_memory_mb(windows.device),
    }
