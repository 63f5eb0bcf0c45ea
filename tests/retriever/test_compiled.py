"""The compiled encoder (retriever.compiled) against eager, for every committed model config.

Each config of ``configs/ml-100k`` (the 10 registry backbones and their variants) is shrunk to a tiny model and
written as the artifact writer does. The ones that compile must give eager's served user vectors within 1e-4
for batches of 1 and several, at the served length and a shorter one, with histories of every length
(left padding included); the ones that do not must say why and leave no encoder.onnx, so they serve eagerly.
"""

from __future__ import annotations

import itertools
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from torch import Tensor, nn

from retriever.backbones import BACKBONES
from retriever.compiled import (
    ENCODER_FILE,
    PARITY_ATOL,
    ExportRefused,
    OnnxEncoder,
    ServedEncoder,
    export_onnx,
    load_encoder,
    write_encoder,
)
from retriever.windows import length_groups, row_groups
from tests.tiny import COMPILED_EAGER as EAGER
from tests.tiny import MODEL_CONFIGS as CONFIGS
from tests.tiny import TINY_ITEMS as N_ITEMS
from tests.tiny import TINY_MAX_LEN as MAX_LEN
from tests.tiny import tiny_config, tiny_retriever


def _histories(batch: int, length: int, seed: int) -> Tensor:
    """(batch, length) left-padded ids, row r holding a history of its own length (1 .. length)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, N_ITEMS + 1, (batch, length), generator=generator)
    real = torch.randint(1, length + 1, (batch,), generator=generator)
    real[0] = length  # one full row, and (batch > 1) the others padded
    ids[torch.arange(length)[None, :] < (length - real)[:, None]] = 0
    return ids


@pytest.mark.parametrize("config", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_every_config_compiles_with_eagers_vectors_or_says_why(config: Path, tmp_path: Path) -> None:
    model = tiny_retriever(config)
    reason = write_encoder(tmp_path, model, MAX_LEN)
    if config.stem in EAGER:
        assert reason is not None
        assert not (tmp_path / ENCODER_FILE).exists()
        with pytest.raises(ExportRefused):
            load_encoder(tmp_path, model, MAX_LEN)
        return
    assert reason is None, reason
    compiled = load_encoder(tmp_path, model, MAX_LEN)
    reference = ServedEncoder(model)
    for seed, (batch, length) in enumerate([(1, MAX_LEN), (8, MAX_LEN), (3, MAX_LEN), (1, 5), (6, 7)]):
        ids = _histories(batch, length, seed)
        with torch.inference_mode():
            expected = reference(ids)
        got = compiled(ids)
        assert got.shape == expected.shape == (batch, 16)
        assert torch.allclose(got, expected, atol=PARITY_ATOL, rtol=0), float((got - expected).abs().max())


def test_the_config_list_covers_every_registry_backbone() -> None:
    backbones = {yaml.safe_load(c.read_text())["model"]["backbone"] for c in CONFIGS}
    assert backbones == set(BACKBONES)
    assert len(CONFIGS) == 17  # one per backbone, the variants of the transformer and trm4rec, and the backtest config


class _Branches(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        if x.sum() > 0:  # a Python branch on a tensor's value: a trace keeps one side
            return x * 2
        return x - 1


def test_a_trace_that_branches_on_tensor_values_is_refused() -> None:
    with pytest.raises(ExportRefused, match=r"depends on tensor values at tests/retriever/test_compiled\.py"):
        export_onnx(_Branches(), [torch.ones(2, 3)], ["x"], "y", {"x": {0: "batch"}})


def test_a_corrupt_encoder_file_is_refused_and_a_missing_one_is_exported_at_load(tmp_path: Path) -> None:
    model = tiny_retriever(next(c for c in CONFIGS if c.stem == "sasrec"))
    (tmp_path / ENCODER_FILE).write_bytes(b"not onnx")
    with pytest.raises(ExportRefused, match="ONNX Runtime cannot load it"):
        load_encoder(tmp_path, model, MAX_LEN)
    (tmp_path / ENCODER_FILE).unlink()
    ids = _histories(4, MAX_LEN, 0)
    with torch.inference_mode():
        expected = ServedEncoder(model)(ids)
    assert torch.allclose(load_encoder(tmp_path, model, MAX_LEN)(ids), expected, atol=PARITY_ATOL, rtol=0)
    assert not (tmp_path / ENCODER_FILE).exists()  # exported in memory: a bundle is never written at load


def test_weights_that_no_longer_match_the_file_are_refused(tmp_path: Path) -> None:
    model = tiny_retriever(next(c for c in CONFIGS if c.stem == "transformer"))
    assert write_encoder(tmp_path, model, MAX_LEN) is None
    with torch.no_grad():
        model.encoder.item_emb.weight.mul_(3.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ExportRefused, match="differ from eager"):
            load_encoder(tmp_path, model, MAX_LEN)


@pytest.mark.parametrize("n_items", [1, 2, 3])
def test_a_catalogue_of_any_size_compiles(n_items: int, tmp_path: Path) -> None:
    # the example input held ids 1..3, so a catalogue of 1 or 2 items failed in the exporter (IndexError)
    torch.manual_seed(0)
    model = tiny_config(next(c for c in CONFIGS if c.stem == "sasrec")).build(n_items).eval()
    assert write_encoder(tmp_path, model, MAX_LEN) is None
    ids = torch.randint(1, n_items + 1, (3, MAX_LEN))
    with torch.inference_mode():
        expected = ServedEncoder(model)(ids)
    assert torch.allclose(load_encoder(tmp_path, model, MAX_LEN)(ids), expected, atol=PARITY_ATOL, rtol=0)


def _brute_force_cost(lengths: list[int], call_cost: int) -> float:
    """The cheapest split of ascending ``lengths`` into runs, over every set of cut points."""
    n, best = len(lengths), float("inf")
    for mask in range(1 << (n - 1)):
        cuts = [0, *(i + 1 for i in range(n - 1) if mask >> i & 1), n]
        best = min(best, sum(call_cost + (b - a) * max(lengths[b - 1], 1) for a, b in itertools.pairwise(cuts)))
    return best


def test_length_groups_are_contiguous_and_as_cheap_as_the_best_split() -> None:
    generator = torch.Generator().manual_seed(0)
    for _ in range(40):
        n = int(torch.randint(1, 9, (1,), generator=generator))
        lengths = sorted(torch.randint(0, 200, (n,), generator=generator).tolist())
        groups = length_groups(torch.tensor(lengths).numpy(), 16)
        assert [a for a, _ in groups] == [0, *(b for _, b in groups[:-1])]
        assert groups[-1][1] == n
        cost = sum(16 + (b - a) * max(lengths[b - 1], 1) for a, b in groups)
        assert cost == _brute_force_cost(lengths, 16)
    assert length_groups(torch.tensor([50, 50, 50, 50]).numpy(), 16) == [(0, 4)]  # equal lengths: one call
    assert length_groups(torch.tensor([10, 12, 190, 200]).numpy(), 16) == [(0, 2), (2, 4)]


class _RowSums:
    """A stand-in ONNX session: each row's output is its ids' sum (whatever its padding); records input shapes."""

    def __init__(self) -> None:
        self.shapes: list[tuple[int, ...]] = []

    def run(self, _: object, feeds: dict[str, Any]) -> list[Any]:
        ids = feeds["item_ids"]
        self.shapes.append(ids.shape)
        return [ids.sum(1, keepdims=True).astype("float32").repeat(2, axis=1)]


def test_a_mixed_batch_runs_in_length_groups_cut_to_their_longest_history_in_the_callers_order() -> None:
    lengths = [200, 3, 195, 5, 0, 198, 4]
    ids = torch.zeros(len(lengths), 200, dtype=torch.long)
    for row, length in enumerate(lengths):
        if length:
            ids[row, -length:] = torch.arange(1, length + 1) + row
    fake = _RowSums()
    out = OnnxEncoder(fake)(ids)
    assert torch.equal(out[:, 0], ids.sum(1).float())  # every row back in its place
    assert sorted(fake.shapes) == [(3, 200), (4, 5)]  # the short rows apart, each call as wide as its longest
    single = _RowSums()
    OnnxEncoder(single)(ids[1:2])
    assert single.shapes == [(1, 200)]  # a lone history runs as it comes: nothing to group


def test_row_groups_cut_each_group_to_its_longest_history_and_keep_one_group_a_slice() -> None:
    ids = torch.zeros(5, 200, dtype=torch.long).numpy()
    for row, length in enumerate([200, 3, 195, 5, 0]):
        ids[row, 200 - length:] = 1
    groups = row_groups(ids, 16)
    assert [(sorted(rows.tolist()), first) for rows, first in groups] == [([1, 3, 4], 195), ([0, 2], 0)]
    full = ids.copy()
    full[:] = 1
    assert row_groups(full, 16) == [(slice(None), 0)]  # every history fills the width: run as it comes
    near = ids[[0, 2]]  # 200 and 195: padding (5 x 2) costs less than another call
    assert row_groups(near, 16) == [(slice(None), 0)]
    assert row_groups(ids[[1, 3]], 16) == [(slice(None), 195)]  # one group, cut to its longest (5)


def test_our_trace_warnings_are_told_apart_in_a_checkout_and_in_an_install(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A TracerWarning from seqrec's code refuses the export. Installed, seqrec lives under site-packages beside
    torch; every path there was taken for a library's, so our own value-dependent traces went unrefused."""
    from retriever import compiled

    assert compiled._ours(compiled.__file__)
    assert not compiled._ours(torch.__file__)
    site = tmp_path / "lib" / "python3.11" / "site-packages"
    monkeypatch.setattr(compiled, "_ROOT", site)
    assert compiled._ours(str(site / "retriever" / "backbones" / "bsarec.py"))
    assert not compiled._ours(str(site / "torch" / "nn" / "modules" / "module.py"))
    assert not compiled._ours(str(tmp_path / "elsewhere.py"))
