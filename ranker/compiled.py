"""The MLP ranker compiled for ONNX Runtime (`retriever.compiled` explains the exporter and the checks).

``ranker/mlp.onnx`` is written beside ``mlp.pt`` when the ranker is written (listed with its sha256 in the
ranker's manifest) or exported once when the service loads a ranker without it. `CompiledMLP` scores a
`FeatureBatch` as `MLPRanker.score` does; it serves only after `check_mlp` finds its scores within
``PARITY_ATOL`` of eager on a smoke batch. LightGBM has no compiled path: it is already native code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from ranker.features import DENSE_FEATURES, FeatureBatch
from ranker.mlp import MLPRanker
from retriever.atomic import atomic_write
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


def load_mlp(folder: Path, mlp: MLPRanker, *, threads: int = 1) -> CompiledMLP:
    """FOLDER/mlp.onnx (exported here for a ranker written before it), checked against eager;
    raises ExportRefused with the reason when it cannot serve."""
    file = folder / MLP_FILE
    source: bytes | Path = file if file.is_file() else export_mlp(mlp)
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
        noise = torch.randn(b, n, len(DENSE_FEATURES), generator=generator)
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
