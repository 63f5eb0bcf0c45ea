"""What `--resume` matches a checkpoint's config on."""

from __future__ import annotations

from retriever.checkpoint import same_run_config
from retriever.config import config_from_dict

RAW = {"model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "max_len": 8}, "train": {"epochs": 2, "seed": 0}}


def _with(**train: object) -> str:
    return config_from_dict({**RAW, "train": {**RAW["train"], **train}}).model_dump_json()


def test_threads_are_no_part_of_a_runs_identity_but_what_it_computes_is() -> None:
    """A pipeline killed under --threads 1 and resumed by the cron line (no --threads) was refused on every run,
    'written with a different config'."""
    config = config_from_dict(RAW)
    assert same_run_config(_with(threads=1), config)
    assert same_run_config(_with(threads=4), config_from_dict({**RAW, "train": {**RAW["train"], "threads": 1}}))
    assert not same_run_config(_with(lr=0.5), config)
    assert not same_run_config(_with(device="cpu"), config)  # another device draws other random numbers
