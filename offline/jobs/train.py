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

from common.errors import SeqrecError
from offline.data.errors import DataError
from offline.data.prepared import PreparedDataset
from offline.data.split import LeaveOneOut, Split
from offline.evaluation.evaluate import EVAL_KS, evaluate_vectors, index_target_ranks, summarize
from offline.jobs.warm_start import warm_start_init
from retriever.artifact import RetrieverArtifact, RetrieverManifest, load_artifact, write_artifact
from retriever.config import ConfigError, RunConfig, config_from_dict
from retriever.distributed import Distributed, broadcast_bytes, process_group
from retriever.features import feature_rows, feature_vocabulary, value_lists
from retriever.index import IndexSpec
from retriever.model import Retriever
from retriever.repeats import resolve_repeats
from retriever.train import fit, resolve_device

log = logging.getLogger(__name__)


RUN_DATA = "data.json"  # beside the checkpoints in OUT/run/


def dataset_fingerprint(data: PreparedDataset) -> dict[str, Any]:
    return {
        "path": str(data.path),
        "source": data.manifest.get("source"),
        "sha256": data.manifest.get("sha256", {}),
        "users": data.n_users,
        "items": data.n_items,
    }


def item_feature_matrix(data: PreparedDataset, column: str) -> tuple[np.ndarray, int]:
    """(n_items + 1, F) int64 ids of each item's values in ``column`` (a list or scalar column), 0 = none.

    Values are catalogue metadata (brand, category, genre), not interactions, so using every
    item's is no leak. Returns the matrix and the number of distinct values.
    """
    if column not in data.items.column_names:
        raise DataError(data.path / "items.parquet", f"no column {column!r} for model.item_features; "
                        f"columns: {', '.join(data.items.column_names)}")
    values = data.items.column(column).to_pylist()
    vocab = feature_vocabulary(values)
    width = max((len(r) for r in value_lists(values)), default=0)
    matrix = np.concatenate([np.zeros((1, max(1, width)), dtype=np.int64), feature_rows(values, vocab, width)])
    return matrix, len(vocab)


def dense_metrics(model: Retriever, split: LeaveOneOut, n_items: int, max_len: int,
                  splits: tuple[Split, ...] = ("valid", "test"), batch_size: int | None = None,
                  ks: tuple[int, ...] = EVAL_KS, *, exclude_seen: bool = True) -> dict[str, Any]:
    """Full-ranking metrics of a retriever, streamed over users and item blocks (any catalogue size)."""
    model.eval()
    with torch.inference_mode():
        items = model.item_vectors()  # (n_items + 1, D), on the model's device
    return evaluate_vectors(model.user_vectors, items, split, scale=model.temperature, splits=splits, ks=ks,
                            batch_size=batch_size, max_len=max_len, exclude_seen=exclude_seen)


def evaluation_rows(n_users: int, users: int | None, seed: int) -> np.ndarray:
    """The sorted rows that ``train.eval_users`` = ``users`` draws out of ``n_users`` (all when None or more)."""
    if users is None or users >= n_users:
        return np.arange(n_users)
    return np.sort(np.random.default_rng(seed).choice(n_users, size=users, replace=False))


def evaluation_sample(split: LeaveOneOut, users: int | None, seed: int) -> LeaveOneOut:
    """``split`` itself, or a fixed random sample of ``users`` of its users (``train.eval_users``)."""
    if users is None or users >= len(split.full):
        return split
    return split.take(evaluation_rows(len(split.full), users, seed))


def index_metrics(artifact: RetrieverArtifact, split: LeaveOneOut, splits: tuple[Split, ...] = ("valid", "test"),
                  ks: tuple[int, ...] = EVAL_KS) -> dict[str, Any]:
    model = artifact.model
    out: dict[str, Any] = {}
    for name in splits:
        ranks = index_target_ranks(
            model.user_vectors, artifact.index, split.inputs(name), split.targets(name), artifact.n_items,
            depth=max(ks), max_len=artifact.max_len, exclude_seen=artifact.manifest.exclude_seen,
            desc=f"{name} (index)",
        )
        out[name] = summarize(ranks, ks)
    return out


def train_retriever(
    config: RunConfig, data: PreparedDataset, out: Path, *, resume: bool = False, index_spec: IndexSpec | None = None,
    dist: Distributed | None = None, init_from: Path | None = None,
) -> RetrieverManifest:
    """Fit, evaluate on valid and test, write the artifact to ``out``; returns its manifest.

    init_from: a bundle to warm-start from (`offline.jobs.warm_start`): its item rows by external id.
    dist: this process's place in a torchrun job. All ranks train; rank 0 alone evaluates and
    writes the artifact, then hands every rank its manifest.
    """
    if dist is None:
        manifest = _train_retriever(config, data, out, resume, index_spec, None, init_from)
        assert manifest is not None
        return manifest
    with process_group(dist, resolve_device(config, dist.local_rank)):
        manifest = _train_retriever(config, data, out, resume, index_spec, dist, init_from)
        text = broadcast_bytes(json.dumps(manifest.to_dict()).encode() if manifest is not None else None)
    assert text is not None
    return manifest if manifest is not None else RetrieverManifest.model_validate_json(text)


def _run_data(run_dir: Path, data: PreparedDataset, resume: bool) -> dict[str, str]:
    """RUN/data.json, for `fit` to write beside its checkpoints: the prepared data a training runs on (its files'
    checksums and sizes). --resume on other data is refused here: it continued silently, a checkpoint of another
    dataset with the same catalogue size trained on, and the bundle was published as a model of the new data."""
    path = run_dir / RUN_DATA
    trained_on = {"sha256": data.manifest.get("sha256", {}), "users": data.n_users, "items": data.n_items}
    if resume and path.exists():
        stored = json.loads(path.read_text())
        if stored != trained_on:
            raise ConfigError(f"{run_dir}: its checkpoint was trained on other data ({stored.get('users')} users, "
                              f"{stored.get('items')} items; {data.path} has {data.n_users} and {data.n_items}, or "
                              "other files); resume with that --data, or choose a new --out")
    return {RUN_DATA: json.dumps(trained_on, indent=2)}


def _train_retriever(
    config: RunConfig, data: PreparedDataset, out: Path, resume: bool, index_spec: IndexSpec | None,
    dist: Distributed | None, init_from: Path | None = None,
) -> RetrieverManifest | None:
    """The manifest of the artifact written to ``out``; None on ranks other than 0, which write nothing."""
    features = None
    if config.model.item_features:
        features, n_features = item_feature_matrix(data, config.model.item_features)
        raw = config.model_dump(mode="json")
        raw["model"].update(n_features=n_features, features_per_item=features.shape[1])
        config = config_from_dict(raw, source="config with item features")
    split = data.split()
    max_len = config.max_len(data.n_items)
    eval_batch = config.train.eval_batch_size
    repeats = resolve_repeats(config.train.repeats, data.repeat_shares["valid"])
    exclude_seen = repeats == "exclude"
    # Model selection and the reported metrics use the same users: all of them, or a fixed sample.
    evaluated = evaluation_sample(split, config.train.eval_users, config.train.seed)

    def validate(model: Retriever) -> dict[str, float]:
        return dense_metrics(model, evaluated, data.n_items, max_len, ("valid",), eval_batch,
                             exclude_seen=exclude_seen)["valid"]

    init = None if init_from is None else warm_start_init(init_from, config, data)
    run_files = _run_data(out / "run", data, resume) if dist is None or dist.is_main else {}
    result = fit(config, split.train.offsets, split.train.items, data.n_items, validate, out / "run", resume=resume,
                 item_features=None if features is None else torch.from_numpy(features), dist=dist, init=init,
                 run_files=run_files)
    if dist is not None and not dist.is_main:
        return None
    metrics = dense_metrics(result.model, evaluated, data.n_items, max_len, batch_size=eval_batch,
                            exclude_seen=exclude_seen)
    training = {
        "evaluated_users": len(evaluated.full),
        "best_epoch": result.best_epoch,
        "epochs_run": len(result.history),
        "seconds": round(result.seconds, 1),
        "seconds_to_best": round(result.seconds_to_best, 1),
        "sequences_per_second": result.sequences_per_second,
        "host": host_numerics(),
        **({} if init_from is None else {"warm_start_from": str(init_from)}),
    }
    manifest = write_artifact(
        out, result.model.cpu(), config, np.asarray(data.item_ids[1:], dtype=str), metrics=metrics,
        dataset=dataset_fingerprint(data), index_spec=index_spec, history=result.history,
        extra={"training": training, "repeats": repeats, "repeat_targets": data.repeat_shares},
        catalogue=data.path / "items.parquet",
        popularity=np.bincount(split.train.items, minlength=data.n_items + 1)[: data.n_items + 1],
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


def repeat_record(artifact: RetrieverArtifact, data: PreparedDataset) -> dict[str, Any]:
    """What every evaluation output repeats: the policy it followed and the data's repeat shares."""
    return {"repeats": artifact.manifest.repeats, "repeat_targets": data.repeat_shares}


def check_catalogue(artifact: RetrieverArtifact, data: PreparedDataset) -> None:
    """The artifact's internal ids must mean the same items as the data's."""
    ours, theirs = artifact.item_ids.astype(str), data.item_ids[1:].astype(str)
    if np.array_equal(ours, theirs):
        return
    raise SeqrecError(f"{artifact.path} was trained on a different item catalogue than {data.path}: "
                      f"{_catalogue_difference(ours, theirs, str(data.path))}")


def _catalogue_difference(ours: np.ndarray, theirs: np.ndarray, where: str) -> str:
    """What tells the artifact's item ids ``ours`` from the data's ``theirs`` (at ``where``), in a few words: the
    counts alone read "58 items than ... (58 items)" for two catalogues of other ids."""
    known = set(ours.tolist())
    new = sorted(set(theirs.tolist()) - known)
    gone = sorted(known - set(theirs.tolist()))
    parts = [f"the artifact has {len(ours)} items, the data {len(theirs)}"] if len(ours) != len(theirs) else []
    if new:
        parts.append(f"{len(new)} of {where}'s item ids are not in the artifact (e.g. {new[0]!r})")
    if gone:
        parts.append(f"{len(gone)} of the artifact's item ids are not in {where} (e.g. {gone[0]!r})")
    if not new and not gone:
        parts.append(f"the same {len(ours)} item ids in another order, so its internal ids mean other items")
    return "; ".join(parts)


def evaluate_artifact(path: Path, data: PreparedDataset, *, ks: tuple[int, ...] = EVAL_KS,
                      use_index: bool = True, batch_size: int | None = None) -> dict[str, Any]:
    artifact = load_artifact(path, with_index=use_index)
    check_catalogue(artifact, data)
    split = data.split()
    model = artifact.model

    dense = dense_metrics(model, split, data.n_items, artifact.max_len, batch_size=batch_size, ks=ks,
                          exclude_seen=artifact.manifest.exclude_seen)
    result: dict[str, Any] = {"artifact": str(path), "version": artifact.manifest.version,
                              **repeat_record(artifact, data), **dense}
    if use_index:
        result["index"] = {"spec": artifact.manifest.index, **index_metrics(artifact, split, ks=ks)}
    return result
