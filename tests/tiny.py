"""What the CLI-level tests share: a tiny retriever config (as command-line overrides) and a tiny
synthetic dataset prepared through the real `seqrec prepare`."""

from pathlib import Path

from offline.cli import main

TINY = [
    "--model.d_model", "16", "--model.n_layers", "1", "--model.n_heads", "2", "--model.max_len", "10",
    "--train.epochs", "3", "--train.batch_size", "64", "--threads", "1", "--seed", "3",
]


def prepare_tiny(out: Path) -> Path:
    """150 users, 60 items, seed 1: the data of tests/offline/cli and tests/ranker."""
    assert main(["prepare", "--dataset", "synthetic", "--n-users", "150", "--n-items", "60", "--mean-length", "12",
                 "--seed", "1", "--out", str(out), "-q"]) == 0
    return out
