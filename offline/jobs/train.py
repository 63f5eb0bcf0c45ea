"""`seqrec train`: prepared data -> fitted retriever -> evaluated, self-describing artifact.

Only training positions reach the loss; the validation target drives early stopping
and model selection; the test target is scored once, at the end.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

from offline.data.features import with_item_features
from offline.data.prepared import PreparedDataset, dataset_fingerprint
from offline.data.temporal import TemporalSplit
from offline.evaluation.retriever import dense_metrics, evaluation_sample
from offline.jobs.temporal import TemporalProtocol, protocol_repeat_shares, protocol_split, temporal_final, trained_on
from offline.jobs.warm_start import warm_start_init
from retriever.artifact import RetrieverManifest, write_artifact
from retriever.config import ConfigError, RunConfig
from retriever.distributed import Distributed, broadcast_bytes, process_group
from retriever.index import IndexSpec
from retriever.model import Retriever
from retriever.repeats import resolve_repeats
from retriever.train import fit, resolve_device

log = logging.getLogger(__name__)


RUN_DATA = "data.json"  # beside the checkpoints in OUT/run/


def train_retriever(
    config: RunConfig, data: PreparedDataset, out: Path, *, resume: bool = False, index_spec: IndexSpec | None = None,
    dist: Distributed | None = None, init_from: Path | None = None, temporal: TemporalProtocol | None = None,
) -> RetrieverManifest:
    """Fit, evaluate on valid and test, write the artifact to ``out``; returns its manifest.

    init_from: a bundle to warm-start from (`offline.jobs.warm_start`): its item rows by external id.
    dist: this process's place in a torchrun job. All ranks train; rank 0 alone evaluates and
    writes the artifact, then hands every rank its manifest.
    temporal: train and evaluate under the global temporal split (offline/jobs/temporal.py) instead of leave-one-out.
    """
    if temporal is not None and dist is not None:
        raise ConfigError("--protocol temporal trains in one process; drop --distributed (or torchrun)")
    if dist is None:
        manifest = _train_retriever(config, data, out, resume, index_spec, None, init_from, temporal)
        assert manifest is not None
        return manifest
    with process_group(dist, resolve_device(config, dist.local_rank)):
        manifest = _train_retriever(config, data, out, resume, index_spec, dist, init_from)
        text = broadcast_bytes(json.dumps(manifest.to_dict()).encode() if manifest is not None else None)
    assert text is not None
    return manifest if manifest is not None else RetrieverManifest.model_validate_json(text)


def _run_data(run_dir: Path, data: PreparedDataset, resume: bool,
              temporal: TemporalProtocol | None = None) -> dict[str, str]:
    """RUN/data.json, for `fit` to write beside its checkpoints: the prepared data a training runs on (its files'
    checksums and sizes). --resume on other data is refused here: it continued silently, a checkpoint of another
    dataset with the same catalogue size trained on, and the bundle was published as a model of the new data."""
    path = run_dir / RUN_DATA
    trained_on = {"sha256": data.manifest.get("sha256", {}), "users": data.n_users, "items": data.n_items,
                  **({} if temporal is None else {"protocol": temporal.record()})}
    if resume and path.exists():
        stored = json.loads(path.read_text())
        if stored.get("protocol") != trained_on.get("protocol"):
            raise ConfigError(f"{run_dir}: its checkpoint was trained under "
                              f"{stored.get('protocol') or 'leave-one-out'}, not under "
                              f"{trained_on.get('protocol') or 'leave-one-out'}; resume with its --protocol flags, "
                              "or choose a new --out")
        if stored != trained_on:
            raise ConfigError(f"{run_dir}: its checkpoint was trained on other data ({stored.get('users')} users, "
                              f"{stored.get('items')} items; {data.path} has {data.n_users} and {data.n_items}, or "
                              "other files); resume with that --data, or choose a new --out")
    return {RUN_DATA: json.dumps(trained_on, indent=2)}


def _train_retriever(
    config: RunConfig, data: PreparedDataset, out: Path, resume: bool, index_spec: IndexSpec | None,
    dist: Distributed | None, init_from: Path | None = None, temporal: TemporalProtocol | None = None,
) -> RetrieverManifest | None:
    """The manifest of the artifact written to ``out``; None on ranks other than 0, which write nothing."""
    config, features = with_item_features(config, data)
    split = protocol_split(data, temporal)
    max_len = config.max_len(data.n_items)
    eval_batch = config.train.eval_batch_size
    shares = protocol_repeat_shares(data, split)
    repeats = resolve_repeats(config.train.repeats, shares["valid"])
    exclude_seen = repeats == "exclude"
    # Model selection and the reported metrics use the same users: all of them, or a fixed sample.
    evaluated = evaluation_sample(split, config.train.eval_users, config.train.seed)

    def validate(model: Retriever) -> dict[str, float]:
        return dense_metrics(model, evaluated, data.n_items, max_len, ("valid",), eval_batch,
                             exclude_seen=exclude_seen)["valid"]

    init = None if init_from is None else warm_start_init(init_from, config, data)
    run_files = _run_data(out / "run", data, resume, temporal) if dist is None or dist.is_main else {}
    result = fit(config, split.train.offsets, split.train.items, data.n_items, validate, out / "run", resume=resume,
                 item_features=features, dist=dist, init=init,
                 run_files=run_files)
    if dist is not None and not dist.is_main:
        return None
    protocol: dict[str, Any]
    if temporal is None:
        metrics, protocol, model, refitted = dense_metrics(result.model, evaluated, data.n_items, max_len,
                                                           batch_size=eval_batch, exclude_seen=exclude_seen), {}, \
            result.model, None
    else:
        assert isinstance(split, TemporalSplit)  # protocol_split's promise
        assert isinstance(evaluated, TemporalSplit)
        metrics, protocol, model, refitted = temporal_final(
            temporal, config, split, evaluated, result, data.n_items, out / "run-refit", max_len=max_len,
            exclude_seen=exclude_seen, batch_size=eval_batch, resume=resume, item_features=features, init=init)
    training = {
        "evaluated_users": len(evaluated.full),
        "best_epoch": result.best_epoch,
        "epochs_run": len(result.history),
        "seconds": round(result.seconds, 1),
        "seconds_to_best": round(result.seconds_to_best, 1),
        "sequences_per_second": result.sequences_per_second,
        "host": host_numerics(),
        **({} if init_from is None else {"warm_start_from": str(init_from)}),
        **({} if refitted is None else {"refit_epochs": len(refitted.history), "refit_seconds":
                                        round(refitted.seconds, 1)}),
    }
    manifest = write_artifact(
        out, model.cpu(), config, np.asarray(data.item_ids[1:], dtype=str), metrics=metrics,
        dataset=dataset_fingerprint(data), index_spec=index_spec, history=result.history,
        extra={"training": training, "repeats": repeats, "repeat_targets": shares,
               **({"protocol": protocol} if protocol else {})},
        catalogue=data.path / "items.parquet",
        popularity=np.bincount(trained_on(split, refitted).items, minlength=data.n_items + 1)[: data.n_items + 1],
    )
    log.info("best epoch %d: valid NDCG@10 %.4f, test NDCG@10 %.4f (repeats: %s)", result.best_epoch,
             metrics["valid"]["NDCG@10"], metrics["test"]["NDCG@10"], repeats)
    return manifest


def host_numerics() -> dict[str, Any]:
    """What decides the last digits of a CPU run besides the seed: the torch build, the instruction set
    its kernels dispatch to and the thread count. Forcing one host's torch from AVX-512 to AVX2 moved the
    same seed's weights by up to 5e-6 and a ranker's metrics in the third decimal
    (docs/results/two-stage/ml-100k-h10-ranker); recorded beside every figure so such a difference can be
    told apart from a code change."""
    return {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "threads": torch.get_num_threads()}
