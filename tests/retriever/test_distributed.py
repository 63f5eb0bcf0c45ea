"""Data-parallel training on 2 CPU processes (gloo) against one process.

The processes are real ones: `torchrun` for the whole `seqrec train` command, and this module
run as a script (``python -m tests.retriever.test_distributed RANK PORT OUT``) for one step.
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from offline.cli import main
from retriever.artifact import read_manifest
from retriever.config import ConfigError, RunConfig, config_from_dict
from retriever.distributed import Distributed, data_parallel, process_group, shard
from retriever.losses import LossContext
from retriever.model import Retriever
from retriever.train import BatchLoss, fit, train_step

ROOT = Path(__file__).resolve().parents[2]
N_USERS, N_ITEMS, LENGTH = 200, 30, 10
# 200 training windows of 8 items; 32 a step is 7 steps an epoch for one process and for two (16 each).
TRAIN = ["--model.d_model", "32", "--model.n_layers", "1", "--model.n_heads", "2", "--model.max_len", "8",
         "--model.dropout", "0.0", "--model.emb_dropout", "0.0", "--loss.name", "full", "--train.batch_size", "32",
         "--train.lr", "0.01", "--train.warmup_steps", "5", "--train.epochs", "4", "--seed", "0", "--threads", "1"]
STEP_CONFIG = {
    "model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "max_len": 8, "dropout": 0.0, "emb_dropout": 0.0},
    "loss": {"name": "full"},  # no in-batch negatives: a half batch's loss does not depend on the other half
    "train": {"batch_size": 8, "lr": 0.01, "seed": 0, "threads": 1},
}
UNTORCHRUN = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(scope="module")
def cycle_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every user walks 1 -> 2 -> ... -> 30 -> 1 from a random start: the next item is certain."""
    folder = tmp_path_factory.mktemp("cycle")
    starts = np.random.default_rng(0).integers(0, N_ITEMS, N_USERS)
    rows = [f"u{u},{(s + t) % N_ITEMS + 1},{t}" for u, s in enumerate(starts) for t in range(LENGTH)]
    (folder / "cycle.csv").write_text("user_id,item_id,timestamp\n" + "\n".join(rows) + "\n")
    assert main(["prepare", "--dataset", "csv", "--path", str(folder / "cycle.csv"), "--out", str(folder / "data"),
                 "-q"]) == 0
    return folder / "data"


def _history(artifact: Path) -> list[dict]:
    return [json.loads(line) for line in (artifact / "history.jsonl").read_text().splitlines()]


def test_torchrun_two_processes_train_one_model_like_one_process(cycle_data: Path, tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    assert main(["train", "--data", str(cycle_data), "--out", str(one), *TRAIN, "-q"]) == 0
    env = {k: v for k, v in os.environ.items() if k not in UNTORCHRUN}
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         "-m", "offline.cli", "train", "--distributed", "--data", str(cycle_data), "--out", str(two), *TRAIN, "-q"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # Rank 0 alone reports and writes: one summary on stdout, one TensorBoard writer, one artifact.
    assert done.stdout.count('"artifact":') == 1
    summary = json.loads(done.stdout)
    assert summary["artifact"] == str(two)
    assert len(list((two / "run" / "tb").iterdir())) == 1
    run_files = [".lock", "best.pt", "data.json", "history.jsonl", "last.pt", "tb"]
    assert sorted(p.name for p in (two / "run").iterdir()) == run_files
    manifest = read_manifest(two)
    assert manifest.training is not None
    assert manifest.training["epochs_run"] == 4
    # Same global batch, so the same optimiser steps (and learning rates) as one process.
    single, double = _history(one), _history(two)
    assert [h["step"] for h in double] == [h["step"] for h in single] == [7, 14, 21, 28]
    assert [h["lr"] for h in double] == [h["lr"] for h in single]
    # Other shuffles and random streams, so not the same numbers. The next item is certain, so
    # "equal within noise" means both learn it: one process reaches NDCG@10 1.0 by epoch 2 here,
    # two by epoch 4 (0.96, 0.98, 0.99 before); 0.95 leaves room for another platform's rounding.
    one_valid = read_manifest(one).metrics["valid"]
    two_valid = manifest.metrics["valid"]
    for valid in (one_valid, two_valid):
        assert valid["HR@10"] == 1.0
        assert valid["NDCG@10"] >= 0.95
    assert double[-1]["loss"] < 0.1 * double[0]["loss"]


def test_distributed_flag_outside_torchrun_is_one_clear_error(
    cycle_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    for key in UNTORCHRUN:
        monkeypatch.delenv(key, raising=False)
    code = main(["train", "--distributed", "--data", str(cycle_data), "--out", str(tmp_path / "x"), *TRAIN])
    err = capsys.readouterr().err.strip()
    assert code == 1
    assert err.count("\n") == 0
    assert err.startswith("seqrec: error: --distributed needs the RANK/WORLD_SIZE/LOCAL_RANK variables")
    assert "torchrun" in err
    assert not (tmp_path / "x").exists()


def test_batch_size_must_split_evenly_over_the_processes(tmp_path: Path) -> None:
    config = config_from_dict(STEP_CONFIG)  # batch_size 8
    offsets, items = np.array([0, 5, 10]), np.array([1, 2, 3, 4, 5, 2, 3, 4, 5, 6])
    with pytest.raises(ConfigError, match="batch_size=8 must be divisible by the 3 processes"):
        fit(config, offsets, items, 6, lambda m: {}, tmp_path, dist=Distributed(rank=0, world_size=3, local_rank=0))


def test_shards_split_each_epoch_between_ranks() -> None:
    windows = torch.arange(1, 11).unsqueeze(1)  # (10, 1): each window its own id
    parts = [shard(windows, 0, 1, Distributed(rank, 2, rank)) for rank in (0, 1)]
    assert [len(p) for p in parts] == [5, 5]
    assert sorted(torch.cat(parts).flatten().tolist()) == list(range(1, 11))
    assert not torch.equal(parts[0], shard(windows, 0, 2, Distributed(0, 2, 0)))  # reshuffled every epoch
    odd = [shard(windows[:9], 0, 1, Distributed(rank, 2, rank)) for rank in (0, 1)]
    assert [len(p) for p in odd] == [5, 5]  # equal shares: one window is repeated
    assert set(torch.cat(odd).flatten().tolist()) == set(range(1, 10))


def _step_setup() -> tuple[RunConfig, Retriever, LossContext, torch.Tensor]:
    """The same model and the same global batch of 8 full windows in every process."""
    config = config_from_dict(STEP_CONFIG)
    torch.manual_seed(0)
    model = config.build(N_ITEMS)
    ctx = LossContext(temperature=model.temperature, project=model._project, generator=torch.Generator())
    starts = torch.randint(0, N_ITEMS, (8, 1), generator=torch.Generator().manual_seed(1))
    batch = (starts + torch.arange(9)) % N_ITEMS + 1  # (8, 9): no padding, 8 trained positions a window
    return config, model, ctx, batch


def _one_step(rank: int, port: int, out: Path) -> None:
    """One data-parallel step of rank ``rank`` of 2 on its half of the global batch; writes loss and gradients."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    config, model, ctx, batch = _step_setup()
    half = batch[rank * 4 : (rank + 1) * 4]
    device = torch.device("cpu")
    with process_group(Distributed(rank=rank, world_size=2, local_rank=rank), device):
        objective = data_parallel(BatchLoss(model, config, ctx), device, half)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loss, grad_norm = train_step(model, half, optimizer, config, ctx, objective=objective)
        del objective  # DDP's reducer holds the gloo group: freed while the group exists, as fit's own is
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]).numpy()
    np.save(out / f"grads{rank}.npy", grads, allow_pickle=False)
    (out / f"rank{rank}.json").write_text(json.dumps({"loss": loss, "grad_norm": grad_norm}))


def test_a_step_on_two_halves_equals_a_step_on_the_whole_batch(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    workers = [subprocess.Popen([sys.executable, "-m", "tests.retriever.test_distributed", str(rank), str(port),
                                 str(tmp_path)], cwd=ROOT, stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
    for worker in workers:
        _, err = worker.communicate(timeout=120)
        assert worker.returncode == 0, err[-3000:]
    config, model, ctx, batch = _step_setup()
    loss, grad_norm = train_step(model, batch, torch.optim.SGD(model.parameters(), lr=0.1), config, ctx)
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]).numpy()
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    # Equal positions per half, so the mean of the halves' mean losses is the whole batch's mean loss,
    # and the all-reduced (averaged) gradient is the whole batch's gradient, on both ranks.
    assert (ranks[0]["loss"] + ranks[1]["loss"]) / 2 == pytest.approx(loss, abs=1e-5)
    assert ranks[0]["loss"] != pytest.approx(ranks[1]["loss"], abs=1e-3)  # the halves really differ
    for r in (0, 1):
        assert ranks[r]["grad_norm"] == pytest.approx(grad_norm, rel=1e-5)
        np.testing.assert_allclose(np.load(tmp_path / f"grads{r}.npy", allow_pickle=False), grads, atol=1e-6)


if __name__ == "__main__":
    _one_step(int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]))
    # The step's results are written. In 2 of 6 full-suite runs on 2026-11-26 the interpreter's
    # teardown aborted after them ("terminate called without an active exception", exit -6: a native thread
    # still joinable at exit), which is not what this test checks; skip the teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


ENTRIES = {"module": "import runpy; runpy.run_module('offline.cli', run_name='__main__', alter_sys=True)",
           "script": "import sys; from offline.cli import main; sys.exit(main())"}  # as the `seqrec` script does


@pytest.mark.parametrize("entry", sorted(ENTRIES))
@pytest.mark.parametrize("torchrun", [True, False])
def test_a_torchrun_worker_leaves_without_the_interpreter_teardown(torchrun: bool, entry: str,
                                                                    tmp_path: Path) -> None:
    """Under torchrun, `python -m offline.cli` and the `seqrec` script exit with the command's code but skip the
    interpreter's teardown (where gloo's threads could abort a finished worker); anywhere else they exit as usual."""
    env = {k: v for k, v in os.environ.items() if k not in UNTORCHRUN}
    if torchrun:
        env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29500")
    hook = f"import atexit; atexit.register(print, 'interpreter teardown'); {ENTRIES[entry]}"
    done = subprocess.run([sys.executable, "-c", hook, "train", "--data", str(tmp_path / "missing"),
                           "--out", str(tmp_path / "out")], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1  # the command's own code for a user error, kept either way
    assert "seqrec: error" in done.stderr
    assert ("interpreter teardown" in done.stdout) is not torchrun
