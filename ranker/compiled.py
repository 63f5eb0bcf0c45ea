"""The MLP ranker compiled for ONNX Runtime (`retriever.compiled` explains the exporter and the checks).

``ranker/mlp.onnx`` is written beside ``mlp.pt`` when the ranker is written (listed with its sha256 in the
ranker's manifest) or exported once when the service loads a ranker without it. `CompiledMLP` scores a
`FeatureBatch` as `MLPRanker.score` does; it serves only after `check_mlp` finds its scores within
``PARITY_ATOL`` of eager on a smoke batch.

`CompiledLGBM` is the LightGBM ranker with its trees compiled to machine code by lleaves (LLVM) when the
service loads it: LightGBM's own predictor walks each tree node by node through its C API, about six
times slower on the Beauty bundle's 186 trees for one request's 200 candidates. The compiled forest
compares in doubles as LightGBM does, so it takes every branch LightGBM takes; only the order of the
sum over trees may differ (scores within 1e-15). Nothing compiled is stored: the machine code is for the
host's CPU. Compiling costs CPU at every load, each worker and each reload: about 7 s for the Beauty
bundle's 186 trees of 31 leaves on the 2-core machine. It serves only after `check_lgbm`
finds it taking LightGBM's branches on rows built at every split threshold.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from common.atomic import atomic_write
from ranker.features import DENSE_FEATURES, FeatureBatch
from ranker.lgbm import LGBMRanker
from ranker.mlp import MLPRanker
from retriever.compiled import PARITY_ATOL, ExportRefused, export_onnx, session

MLP_FILE = "mlp.onnx"
INPUTS = ("dense", "candidates", "meta", "year_bucket", "user", "product")


class _Scorer(nn.Module):
    """`MLPRanker.forward` over the feature batch's tensors, as ONNX takes them."""

    def __init__(self, mlp: MLPRanker) -> None:
        super().__init__()
        self.mlp = mlp

    def forward(self, dense: Tensor, candidates: Tensor, meta: Tensor, year_bucket: Tensor, user: Tensor,
                product: Tensor) -> Tensor:
        return self.mlp(FeatureBatch(dense, candidates, meta, year_bucket, user, product))


class CompiledMLP:
    """The ranker protocol (`ranker.artifact.Ranker`) on an ONNX Runtime session; saving saves the eager model."""

    kind: ClassVar[str] = "mlp"

    def __init__(self, eager: MLPRanker, onnx_session: Any) -> None:
        self.eager = eager
        self.session = onnx_session

    def score(self, batch: FeatureBatch) -> Tensor:
        """(B, N) scores; empty candidate slots get -inf."""
        feeds = {name: np.ascontiguousarray(getattr(batch, name).numpy()) for name in INPUTS}
        return torch.from_numpy(self.session.run(None, feeds)[0])

    def save(self, folder: Path) -> dict[str, Any]:
        return self.eager.save(folder)


def export_mlp(mlp: MLPRanker) -> bytes:
    """The MLP's scorer as ONNX bytes, batch and candidate count dynamic; raises ExportRefused."""
    example = smoke_batches(mlp)[-1]
    dynamic = {name: {0: "batch", 1: "candidates"} for name in INPUTS if name != "user"}
    dynamic["meta"] = {0: "batch", 1: "candidates", 2: "values"}  # the catalogue's metadata width
    return export_onnx(_Scorer(mlp), [getattr(example, name) for name in INPUTS], INPUTS, "scores",
                       {**dynamic, "user": {0: "batch"}, "scores": {0: "batch", 1: "candidates"}})


def write_mlp(folder: Path, mlp: MLPRanker) -> str | None:
    """Write FOLDER/mlp.onnx when the scorer exports and matches eager; None then, else why it stays eager."""
    try:
        data = export_mlp(mlp)
        check_mlp(CompiledMLP(mlp, session(data)), mlp)
    except ExportRefused as err:
        (folder / MLP_FILE).unlink(missing_ok=True)
        return str(err)
    atomic_write(folder / MLP_FILE, lambda p: p.write_bytes(data))
    return None


def load_mlp(folder: Path | None, mlp: MLPRanker, *, threads: int = 1) -> CompiledMLP:
    """FOLDER/mlp.onnx (exported here for a ranker written before it, or not written yet: folder None),
    checked against eager; raises ExportRefused with the reason when it cannot serve."""
    file = None if folder is None else folder / MLP_FILE
    source: bytes | Path = file if file is not None and file.is_file() else export_mlp(mlp)
    try:
        compiled = CompiledMLP(mlp, session(source, threads))
    except Exception as err:  # onnxruntime's own exception types; a file it cannot load stays eager
        raise ExportRefused(f"ONNX Runtime cannot load it: {str(err).strip()[:300]}") from None
    check_mlp(compiled, mlp)
    return compiled


def smoke_batches(mlp: MLPRanker, shapes: tuple[tuple[int, int, int], ...] = ((1, 1, 1), (4, 20, 3)),
                  seed: int = 0) -> list[FeatureBatch]:
    """Random feature batches of (requests, candidate slots, metadata values per item) ``shapes``: by default
    1 and 4 requests with 1 and 20 slots (some empty or unknown) and 1 and 3 values."""
    config = mlp.config
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for b, n, m in shapes:
        # features at the scale training saw them; unknown items only if training had some (else its
        # standardised flag is ~1e6 and the scores' float32 rounding alone exceeds the tolerance)
        noise = torch.randn(b, n, mlp.dense_mean.shape[-1], generator=generator)  # base + extra columns
        dense = (mlp.dense_mean + mlp.dense_std * noise).detach()
        unknown = DENSE_FEATURES.index("is_unknown")
        seen = float(mlp.dense_std[unknown]) > 1e-3
        dense[..., unknown] = ((torch.rand(b, n, generator=generator) < 0.2) & seen).float()
        candidates = torch.randint(1, config.n_items + 1, (b, n), generator=generator)
        candidates[:, n // 2 + 1:] *= torch.rand(b, n - n // 2 - 1, generator=generator) < 0.5  # empty slots
        meta = torch.randint(0, config.n_meta + 1, (b, n, m), generator=generator)
        year = torch.randint(0, config.n_year_buckets + 1, (b, n), generator=generator)
        user = torch.nn.functional.normalize(torch.randn(b, config.dim, generator=generator), dim=-1)
        product = user[:, None, :] * torch.randn(b, n, config.dim, generator=generator)
        batches.append(FeatureBatch(dense, candidates, meta, year, user, product))
    return batches


def check_mlp(compiled: CompiledMLP, mlp: MLPRanker) -> None:
    """Raise ExportRefused unless the compiled scores match eager within PARITY_ATOL (-inf where eager's are)."""
    for batch in smoke_batches(mlp):
        expected = mlp.score(batch)
        try:
            got = compiled.score(batch)
        except Exception as err:  # a runtime failure on a shape is a refusal like a mismatch
            raise ExportRefused(f"it fails on a {tuple(batch.candidates.shape)} batch: {err}") from None
        same_slots = got.shape == expected.shape and bool((torch.isinf(got) == torch.isinf(expected)).all())
        finite = torch.isfinite(expected)
        gap = float((got[finite] - expected[finite]).abs().amax()) if same_slots and finite.any() else 0.0
        gap = gap if same_slots else float("inf")
        if not gap <= PARITY_ATOL:
            raise ExportRefused(f"its scores differ from eager by {gap:.2g} on a {tuple(batch.candidates.shape)} "
                                f"batch (allowed {PARITY_ATOL:g})")


LGBM_ZERO = 1e-35  # LightGBM's kZeroThreshold
TREES_ATOL = 1e-9  # the same branches, summed in another order: ~1e-15; a branch taken differently moves a leaf


class CompiledLGBM(LGBMRanker):
    """`LGBMRanker` predicting with lleaves' machine code for its trees; saving saves the booster as before."""

    def __init__(self, eager: LGBMRanker, forest: Any) -> None:
        super().__init__(eager.booster, eager.params, eager.extra_features)
        self.forest = forest

    def predict(self, rows: np.ndarray) -> np.ndarray:
        # LightGBM reads a dense row as sparse: a value within its kZeroThreshold of 0 (NaN aside) is read as 0,
        # so a split at +-1e-35 sends it to 0's side; lleaves compares the value as given
        rows = np.where((np.abs(rows) > LGBM_ZERO) | np.isnan(rows), rows, np.float32(0))
        return np.asarray(self.forest.predict(rows, n_jobs=1))


def load_lgbm(ranker: LGBMRanker) -> CompiledLGBM:
    """The ranker's booster compiled by lleaves for this CPU and checked against LightGBM; raises ExportRefused
    with the reason when it cannot serve (lleaves missing or failing, or a score that differs)."""
    try:
        import lleaves
    except ImportError as err:
        raise ExportRefused(f"lleaves is not importable ({err})") from None
    with tempfile.TemporaryDirectory(prefix="seqrec-lleaves-") as tmp:
        model = Path(tmp) / "lgbm.txt"
        model.write_text(ranker.booster.model_to_string())
        try:
            forest = lleaves.Model(model_file=str(model))
            forest.compile()
        except Exception as err:  # lleaves' parser and LLVM raise their own types; LightGBM serves instead
            raise ExportRefused(f"lleaves cannot compile it: {type(err).__name__}: {str(err)[:300]}") from None
    compiled = CompiledLGBM(ranker, forest)
    check_lgbm(compiled, ranker)
    return compiled


def threshold_rows(booster: Any, n: int = 512, seed: int = 0) -> np.ndarray:
    """(n, F) float32 rows whose every value sits at one of the booster's split thresholds for that feature or
    one float32 step either side of it (features no tree splits on get 0 or 1), and one value in 50 NaN: rows
    that reach many leaves and put values exactly where a comparison could branch differently."""
    n_features = booster.num_feature()
    thresholds: list[list[float]] = [[0.0, 1.0] for _ in range(n_features)]
    stack = [tree["tree_structure"] for tree in booster.dump_model()["tree_info"]]
    while stack:
        node = stack.pop()
        if "split_feature" in node:
            thresholds[node["split_feature"]].append(float(node["threshold"]))
            stack += [node["left_child"], node["right_child"]]
    generator = np.random.default_rng(seed)
    rows = np.empty((n, n_features), dtype=np.float32)
    for f, values in enumerate(thresholds):
        at = np.asarray(values, dtype=np.float32)[generator.integers(0, len(values), n)]
        step = generator.integers(-1, 2, n)  # -1, 0, +1 float32 steps
        rows[:, f] = np.where(step < 0, np.nextafter(at, np.float32(-np.inf)),
                              np.where(step > 0, np.nextafter(at, np.float32(np.inf)), at))
    rows[generator.random(rows.shape) < 0.02] = np.nan
    return rows


def check_lgbm(compiled: CompiledLGBM, ranker: LGBMRanker) -> None:
    """Raise ExportRefused unless the compiled forest scores `threshold_rows` as LightGBM does."""
    rows = threshold_rows(ranker.booster)
    try:
        got = compiled.predict(rows)
    except Exception as err:  # a runtime failure is a refusal like a mismatch
        raise ExportRefused(f"it fails on the check rows: {err}") from None
    expected = ranker.predict(rows)
    gap = float(np.abs(got - expected).max()) if got.shape == expected.shape else float("inf")
    if not gap <= TREES_ATOL:
        raise ExportRefused(f"its scores differ from LightGBM's by {gap:.2g} (allowed {TREES_ATOL:g})")
