"""What the CLI-level tests share: a tiny retriever config (as command-line overrides) and a tiny
synthetic dataset prepared through the real `seqrec prepare`; and every committed model config as a tiny
model (`tiny_retriever`)."""

from pathlib import Path
from typing import Any

import torch
import yaml

from offline.cli import main
from retriever.config import RunConfig, config_from_dict
from retriever.model import Retriever

TINY = [
    "--model.d_model", "16", "--model.n_layers", "1", "--model.n_heads", "2", "--model.max_len", "10",
    "--train.epochs", "3", "--train.batch_size", "64", "--threads", "1", "--seed", "3",
]


def prepare_tiny(out: Path) -> Path:
    """150 users, 60 items, seed 1: the data of tests/offline/cli and tests/ranker."""
    assert main(["prepare", "--dataset", "synthetic", "--n-users", "150", "--n-items", "60", "--mean-length", "12",
                 "--seed", "1", "--out", str(out), "-q"]) == 0
    return out


def train_tiny(data: Path, out: Path) -> Path:
    """A tiny retriever (TINY) trained on the prepared folder ``data`` through the real `seqrec train`, into ``out``."""
    assert main(["train", "--data", str(data), "--out", str(out), *TINY, "-q"]) == 0
    return out


# Every committed model config (the registry's backbones and their variants), shrunk by `tiny_retriever`: the
# compiled path's parity tests run over these (tests/retriever/test_compiled.py, tests/service/test_compiled.py).
MODEL_CONFIGS = sorted(Path(__file__).resolve().parents[1].glob("configs/ml-100k/*.yaml"))
TINY_ITEMS, TINY_MAX_LEN = 40, 12
# Configs whose encoder does not compile, and why: TRM4Rec Adaptive halts on tensor values (the exporter
# fails on its halting mask; a trace would keep one input's number of steps), xLSTM's cell loops over the
# length in Python (the exporter fails on its shape arithmetic; a trace would keep the example's length).
COMPILED_EAGER = {"trm4rec-adaptive", "xlstm"}
_TINY_SIZES = {"d_model": 16, "n_layers": 2, "n_heads": 2, "max_len": TINY_MAX_LEN, "hidden_size": 16}


def tiny_config(path: Path) -> RunConfig:
    """Config ``path`` at tiny sizes (made-up item features where the config reads them from the data)."""
    raw = yaml.safe_load(path.read_text())
    model: dict[str, Any] = raw["model"]
    model.update({k: v for k, v in _TINY_SIZES.items() if k in model})
    if "n_steps" in model:
        model["n_steps"] = min(model["n_steps"], 3)
    if model.pop("item_features", None) is not None:  # the genres of the ML-100K transformer
        model.update(n_features=6, features_per_item=2)
    return config_from_dict(raw)


def tiny_retriever(path: Path) -> Retriever:
    """The model of config ``path`` (`tiny_config`) over TINY_ITEMS items, seeded, untrained, in eval mode."""
    config = tiny_config(path)
    torch.manual_seed(0)
    retriever = config.build(TINY_ITEMS).eval()
    if config.model_dump()["model"].get("n_features"):
        retriever.encoder.set_item_features(torch.randint(0, 7, (TINY_ITEMS + 1, 2)))
    return retriever
