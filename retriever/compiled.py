"""The compiled CPU inference path: a module traced to ONNX once, run by ONNX Runtime.

The served user encoder (``Retriever.user_vectors``: (B, T) left-padded ids -> (B, D) float32, the state
at the last position, projected as the model scores) is exported when an artifact is written
(``encoder.onnx``, listed with its sha256 in the manifest) or, for an artifact without the file, once
when the service loads it; `ranker.compiled` does the same for the MLP ranker. Nothing is exported per
request.

Why the TorchScript exporter (``torch.onnx.export(dynamo=False)``) rather than the torch.export-based
default of torch >= 2.9: on the 2-core machine it exports a tiny transformer in about a second against
half a minute, it exports GRU and LSTM (the dynamo path fails on both), and batch and length stay
dynamic. Its weakness is that tracing records one path through Python control flow; a trace that
branched on a tensor's value (TRM4Rec's adaptive halting, xLSTM's step loop) raises a ``TracerWarning``
in our own code, and such an export is refused here rather than risk a graph that is right only for the
example it was traced with. Every compiled module must also pass `parity` (outputs within
``PARITY_ATOL`` of eager on a smoke batch) before it serves; a module that does not export or does not
match stays eager.
"""

from __future__ import annotations

import copy
import tempfile
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from common.atomic import atomic_write
from common.errors import first_line
from retriever.model import Retriever
from retriever.windows import row_groups

ENCODER_FILE = "encoder.onnx"
OPSET = 18
PARITY_ATOL = 1e-4
# A TracerWarning raised from seqrec's own packages is our control flow. They sit under one root in a checkout
# (the repository) and in an install (site-packages), beside other libraries there.
_ROOT = Path(__file__).resolve().parents[1]
_PACKAGES = ("retriever", "ranker", "service", "offline", "tests")  # tests: modules the test suite exports


class ExportRefused(Exception):
    """The module cannot be compiled; the message says why (it then runs eagerly)."""


class ServedEncoder(nn.Module):
    """What the service computes per history, as one module: (B, T) ids -> (B, D) float32 user vectors."""

    def __init__(self, model: Retriever) -> None:
        super().__init__()
        self.model = model

    def forward(self, item_ids: Tensor) -> Tensor:
        return self.model.user_vectors(item_ids).float()


def export_onnx(module: nn.Module, example: Sequence[Tensor], inputs: Sequence[str], output: str,
                dynamic: Mapping[str, Mapping[int, str]]) -> bytes:
    """Trace ``module`` (in eval mode) on ``example`` into ONNX bytes; raises ExportRefused."""
    module.eval()
    with warnings.catch_warnings(record=True) as caught, tempfile.TemporaryDirectory() as work:
        warnings.simplefilter("always")
        file = Path(work) / "model.onnx"
        try:
            with torch.no_grad():
                torch.onnx.export(module, tuple(example), file, dynamo=False, input_names=list(inputs),
                                  output_names=[output], dynamic_axes={k: dict(v) for k, v in dynamic.items()},
                                  opset_version=OPSET)
        except Exception as err:  # the exporter raises many types; any of them means "stays eager"
            raise ExportRefused(f"the exporter failed: {type(err).__name__}: {first_line(err, limit=300)}") from None
        data = file.read_bytes()
    for warning in caught:
        if issubclass(warning.category, torch.jit.TracerWarning) and _ours(warning.filename):
            where = f"{Path(warning.filename).resolve().relative_to(_ROOT)}:{warning.lineno}"
            raise ExportRefused(f"the trace depends on tensor values at {where} "
                                f"({str(warning.message).split('.')[0]})")
    return data


def session(model: bytes | Path, threads: int = 1) -> Any:
    """An ONNX Runtime CPU session on ``threads`` intra-op threads that never spin-wait (a busy machine)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3  # warnings about unused initialisers are noise here
    source = model if isinstance(model, bytes) else str(model)
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


class OnnxEncoder:
    """The compiled encoder: (B, T) int64 ids -> (B, D) float32 user vectors, as `ServedEncoder`.

    A batch is run in groups of similar history length (`retriever.windows.row_groups`), each cut to its longest
    history: a left-padded batch costs its longest history for every row, and histories of 50-200 items in one
    micro-batch spent about 40 % of the encoder's time on padding. Every backbone's user vector is the same
    whatever left padding it gets (tests/retriever/test_backbones.py), so only the time changes.
    """

    def __init__(self, onnx_session: Any) -> None:
        self.session = onnx_session

    def __call__(self, item_ids: Tensor) -> Tensor:
        ids = np.ascontiguousarray(item_ids.numpy(), dtype=np.int64)
        groups = row_groups(ids, CALL_COST)
        if len(groups) == 1:
            return torch.from_numpy(self._run(ids[:, groups[0][1]:]))
        out: np.ndarray | None = None
        for rows, first in groups:
            got = self._run(ids[rows, first:])
            if out is None:
                out = np.empty((len(ids), got.shape[1]), dtype=got.dtype)
            out[rows] = got
        assert out is not None
        return torch.from_numpy(out)

    def _run(self, ids: np.ndarray) -> np.ndarray:
        return self.session.run(None, {"item_ids": np.ascontiguousarray(ids)})[0]


CALL_COST = 16  # one ONNX Runtime call costs about as much as 16 more positions of one row (0.1 ms vs ~0.0055)


def export_encoder(model: Retriever, max_len: int) -> bytes:
    """The served encoder as ONNX bytes, batch and length dynamic; raises ExportRefused."""
    n_items = model.item_vectors().shape[0] - 1
    short = min(3, max_len)
    example = torch.zeros(2, max_len, dtype=torch.long)  # a short left-padded history and a full one
    example[0, -short:] = torch.arange(short) % n_items + 1  # ids in [1, n_items]: a catalogue may hold 1 item
    example[1] = torch.arange(max_len) % n_items + 1
    return export_onnx(ServedEncoder(model), [example], ["item_ids"], "user_vectors",
                       {"item_ids": {0: "batch", 1: "length"}, "user_vectors": {0: "batch"}})


def write_encoder(folder: Path, model: Retriever, max_len: int) -> str | None:
    """Write FOLDER/encoder.onnx atomically when the encoder exports and matches eager; returns None then,
    else the reason it stays eager (and removes a stale file). Works on a CPU copy in eval mode, so a model
    being trained (on any device) is left as it was."""
    model = copy.deepcopy(model).cpu().eval()
    try:
        data = export_encoder(model, max_len)
        check_encoder(OnnxEncoder(session(data)), model, max_len)
    except ExportRefused as err:
        (folder / ENCODER_FILE).unlink(missing_ok=True)
        return str(err)
    atomic_write(folder / ENCODER_FILE, lambda p: p.write_bytes(data))
    return None


def load_encoder(folder: Path, model: Retriever, max_len: int, *, threads: int = 1) -> OnnxEncoder:
    """FOLDER/encoder.onnx (exported here when the artifact predates it), checked against eager;
    raises ExportRefused with the reason when it cannot serve."""
    file = folder / ENCODER_FILE
    source: bytes | Path = file if file.is_file() else export_encoder(model, max_len)
    try:
        encoder = OnnxEncoder(session(source, threads))
    except Exception as err:  # onnxruntime's own exception types; a file it cannot load stays eager
        raise ExportRefused(f"ONNX Runtime cannot load it: {first_line(err, limit=300)}") from None
    check_encoder(encoder, model, max_len)
    return encoder


def smoke_histories(n_items: int, max_len: int) -> list[Tensor]:
    """Left-padded (B, T) histories the parity check runs: batch 1 and 5, real lengths from 1 to max_len,
    at the served length max_len and at a shorter one."""
    generator = torch.Generator().manual_seed(0)
    batches = []
    for batch, length in ((1, max_len), (5, max_len), (5, max(1, max_len // 2)), (1, 1)):
        ids = torch.randint(1, n_items + 1, (batch, length), generator=generator)
        real = torch.linspace(1, length, batch).round().long()  # each row its own history length
        ids[torch.arange(length)[None, :] < (length - real)[:, None]] = 0
        batches.append(ids)
    return batches


def check_encoder(encoder: Callable[[Tensor], Tensor], model: Retriever, max_len: int) -> None:
    """Raise ExportRefused unless ``encoder`` gives eager's user vectors within PARITY_ATOL."""
    reference = ServedEncoder(model).eval()
    n_items = model.item_vectors().shape[0] - 1
    for ids in smoke_histories(n_items, max_len):
        with torch.inference_mode():
            expected = reference(ids)
        try:
            got = encoder(ids)
        except Exception as err:  # a runtime failure on a shape is a refusal like a mismatch
            raise ExportRefused(f"it fails on a {tuple(ids.shape)} batch: {first_line(err, limit=300)}") from None
        gap = float((got - expected).abs().max()) if got.shape == expected.shape else float("inf")
        if not gap <= PARITY_ATOL:
            raise ExportRefused(f"its user vectors differ from eager by {gap:.2g} on a {tuple(ids.shape)} batch "
                                f"(allowed {PARITY_ATOL:g})")


def _ours(filename: str) -> bool:
    """Whether the file is seqrec's: the checkout's .venv and an install's site-packages hold torch too, and an
    installed seqrec is itself under site-packages (refusing every path there let its own warnings through)."""
    path = Path(filename).resolve()
    return path.is_relative_to(_ROOT) and path.relative_to(_ROOT).parts[0] in _PACKAGES
