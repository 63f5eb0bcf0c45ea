"""Why some TRM4Rec seeds stall: train a few epochs per seed, then compare gradients and state norms.

    python -m offline.bench.train.trm4rec_stall --config configs/beauty/trm4rec-s4b2.yaml --data data/beauty \\
        --out runs/stall --seeds 42,2023 --epochs 5
    python -m offline.bench.train.trm4rec_stall ... --out runs/stall-do02 --seeds 42 \\
        --set model.dropout=0.2 --set model.emb_dropout=0.2

Each seed is a plain `seqrec train` run with the committed config (its full learning-rate
schedule), stopped once its checkpoint holds --epochs epochs; the command is printed, and a
run already that far in --out is reused. Per run it prints a Markdown row:
- loss and validation NDCG@10 at the last epoch (history.jsonl);
- gradient norms before clipping (TensorBoard's ``train/grad_norm``) from step --settle on,
  up to the last epoch's end: the range of the --window-step means and the largest step;
- the mean norm of the residual stream at real positions after each recursion step (eval
  mode, --windows training windows drawn with seed 0), and of the item embeddings fed in;
- the median gradient norm of the item table and of the first block's attention projection
  over --batches training batches (train mode, seed 0).
"""

from __future__ import annotations

import argparse
import glob
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from offline.data.prepared import load_prepared
from offline.tables import markdown_header, markdown_row
from retriever.config import RunConfig, load_config
from retriever.losses import LossContext, item_log_prob
from retriever.model import Retriever
from retriever.train import BatchLoss
from retriever.windows import make_windows


def train_until(command: list[str], run_dir: Path, epochs: int) -> None:
    """Run ``seqrec train`` until its checkpoint holds ``epochs`` epochs and TensorBoard has their
    steps (the writer flushes every two minutes), then stop it."""
    if done(run_dir, epochs):
        return
    print("$", shlex.join(command), file=sys.stderr)
    process = subprocess.Popen(command)
    try:
        while not done(run_dir, epochs):
            if process.poll() is not None:
                raise SystemExit(f"training exited with code {process.returncode} before epoch {epochs}")
            time.sleep(5)
    finally:
        process.terminate()
        process.wait()


def done(run_dir: Path, epochs: int) -> bool:
    history = checkpoint_history(run_dir)
    return len(history) >= epochs and len(grad_norms(run_dir)) >= history[epochs - 1]["step"]


def checkpoint_history(run_dir: Path) -> list[dict[str, Any]]:
    if not (run_dir / "last.pt").exists():
        return []
    saved = torch.load(run_dir / "last.pt", map_location="cpu", weights_only=True)
    return list(json.loads(saved["history"]))


def grad_norms(run_dir: Path) -> np.ndarray:
    """``train/grad_norm`` of every logged step, in step order (TensorBoard steps start at 1)."""
    files = glob.glob(str(run_dir / "tb" / "*"))
    if not files:
        return np.array([])
    events = EventAccumulator(files[0], size_guidance={"scalars": 0})
    events.Reload()
    if "train/grad_norm" not in events.Tags()["scalars"]:
        return np.array([])
    return np.array([e.value for e in sorted(events.Scalars("train/grad_norm"), key=lambda e: e.step)])


def state_norms(model: Retriever, windows: torch.Tensor) -> list[float]:
    """Mean norm at real positions of the item embeddings, then of the state after each step."""
    encoder: Any = model.encoder  # a TRM4Rec: its blocks and item table
    real = windows != 0
    states: list[torch.Tensor] = []
    hook = encoder.blocks[-1].register_forward_hook(lambda _m, _i, out: states.append(out))
    try:
        with torch.no_grad():
            model.eval()
            model.hidden(windows)
            norms = [float(encoder.item_emb(windows)[real].norm(dim=-1).mean())]
    finally:
        hook.remove()
    return norms + [float(s[real].norm(dim=-1).mean()) for s in states]


def parameter_grads(model: Retriever, config: RunConfig, windows: torch.Tensor, items: np.ndarray,
                    n_items: int, batches: int) -> dict[str, float]:
    torch.manual_seed(0)  # dropout masks
    generator = torch.Generator().manual_seed(0)
    ctx = LossContext(temperature=model.temperature, project=model._project, generator=generator,
                      item_log_prob=item_log_prob(torch.from_numpy(items), n_items))
    objective = BatchLoss(model, config, ctx)
    order = torch.randperm(len(windows), generator=generator)
    size = config.train.batch_size
    norms: dict[str, list[float]] = {}
    model.train()
    for b in range(batches):
        model.zero_grad(set_to_none=True)
        objective(windows[order[b * size:(b + 1) * size]]).backward()
        for name, parameter in model.named_parameters():
            if parameter.grad is not None:
                norms.setdefault(name, []).append(float(parameter.grad.norm()))
    return {name: float(np.median(values)) for name, values in norms.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seeds", default="42,2023")
    parser.add_argument("--epochs", type=int, default=5, help="epochs to train each seed before stopping it")
    parser.add_argument("--settle", type=int, default=130, help="first step whose gradient norms are summarised")
    parser.add_argument("--window", type=int, default=44, help="steps per averaged gradient-norm window")
    parser.add_argument("--windows", type=int, default=512, help="training windows for the state norms")
    parser.add_argument("--batches", type=int, default=8, help="training batches for the parameter gradients")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="config override (repeatable), e.g. --set train.lr=3e-4")
    args = parser.parse_args()
    config = load_config(args.config, args.set)
    extra = [part for item in args.set for part in (f"--{item.split('=', 1)[0]}", item.split("=", 1)[1])]
    if config.model.backbone != "trm4rec":
        raise SystemExit(f"{args.config}: backbone {config.model.backbone!r}, this diagnosis is for trm4rec")
    torch.set_num_threads(1)
    data = load_prepared(args.data)
    split = data.split()
    windows = torch.from_numpy(make_windows(split.train.offsets, split.train.items, config.max_len(data.n_items)))
    sample = windows[torch.randperm(len(windows), generator=torch.Generator().manual_seed(0))[:args.windows], :-1]
    print(markdown_header(["seed", "epoch", "loss", "valid NDCG@10", "grad-norm window means", "largest step",
                           "state norms (embeddings, then each step)",
                           "median grad: item table, first attention"]))
    for seed in [int(s) for s in args.seeds.split(",")]:
        out = args.out / f"seed{seed}"
        command = [sys.executable, "-m", "offline.cli", "train", "--config", str(args.config), "--data",
                   str(args.data), "--out", str(out), "--seed", str(seed), "--threads", "1", *extra]
        train_until(command, out / "run", args.epochs)
        saved = torch.load(out / "run" / "last.pt", map_location="cpu", weights_only=True)
        record = json.loads(saved["history"])[-1]
        if record["epoch"] != args.epochs:
            raise SystemExit(f"{out}: its checkpoint is at epoch {record['epoch']}, not {args.epochs}; use a new --out")
        norms = grad_norms(out / "run")[:record["step"]]
        starts = [s for s in range(0, len(norms), args.window) if s >= args.settle]
        means = [float(norms[s:s + args.window].mean()) for s in starts]
        model = config.build(data.n_items)
        model.load_state_dict(saved["model"])
        states = state_norms(model, sample)
        grads = parameter_grads(model, config, windows, split.train.items, data.n_items, args.batches)
        print(markdown_row([seed, record["epoch"], f"{record['loss']:.2f}", f"{record['valid']['NDCG@10']:.4f}",
                            f"{min(means):.1f}-{max(means):.1f}", f"{norms[args.settle:].max():,.1f}",
                            ", ".join(f"{n:.1f}" for n in states),
                            f"{grads['encoder.item_emb.weight']:.1f}, "
                            f"{grads['encoder.blocks.0.attn.qkv.weight']:.1f}"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
