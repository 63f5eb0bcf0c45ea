"""Warm-start retraining (`seqrec train --init-from BUNDLE`) and the derived folders it is measured on."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from offline.cli import main
from offline.data.derive import hold_out_items, time_prefix
from offline.data.prepared import load_prepared
from offline.jobs.warm_start import warm_start_init
from retriever.artifact import load_artifact, read_manifest
from retriever.config import load_config
from tests.tiny import TINY, prepare_tiny

FEATURES = ["--model.item_features", "genres"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(full data, the same without 10% of its items, a bundle trained on the latter)."""
    root = tmp_path_factory.mktemp("warm")
    full = prepare_tiny(root / "full")
    hold_out_items(load_prepared(full), root / "held", 0.1, seed=0)
    bundle = root / "old"
    assert main(["train", "--data", str(root / "held" / "train"), "--out", str(bundle), *TINY, *FEATURES, "-q"]) == 0
    return full, root / "held" / "train", bundle


def test_hold_out_removes_every_interaction_of_the_held_items(folders: tuple[Path, Path, Path]) -> None:
    full, held, _ = folders
    data, kept = load_prepared(full), load_prepared(held)
    gone = set(data.item_ids[1:]) - set(kept.item_ids[1:])
    assert len(gone) == 6  # 10% of 60
    assert not gone & set(kept.item_ids[kept.sequences.items])  # not even as validation or test targets
    assert kept.n_users <= data.n_users


def test_time_prefix_keeps_targets_and_cuts_training_positions(folders: tuple[Path, Path, Path],
                                                              tmp_path: Path) -> None:
    full, _, _ = folders
    data = load_prepared(full)
    time_prefix(data, tmp_path / "p", 0.5)
    cut = load_prepared(tmp_path / "p")
    a, b = data.split(), cut.split()
    assert np.array_equal(a.valid_targets, b.valid_targets)
    assert np.array_equal(a.test_targets, b.test_targets)
    expected = np.maximum(1, (a.train.lengths * 0.5).astype(int))
    assert np.array_equal(b.train.lengths, expected)
    first = a.train.items[a.train.offsets[0] : a.train.offsets[0] + expected[0]]
    assert np.array_equal(b.train.items[: expected[0]], first)  # the first positions, in order


def test_init_carries_rows_by_external_id_and_leaves_new_items_fresh(folders: tuple[Path, Path, Path]) -> None:
    full, _, bundle = folders
    data = load_prepared(full)
    old = load_artifact(bundle, with_index=False)
    config = load_config(None, ["model.d_model=16", "model.n_layers=1", "model.n_heads=2", "model.max_len=10",
                                "model.item_features=genres"])
    from offline.data.features import item_feature_matrix
    from retriever.config import config_from_dict

    features, n_features = item_feature_matrix(data, "genres")
    raw = config.model_dump(mode="json")
    raw["model"].update(n_features=n_features, features_per_item=features.shape[1])
    config = config_from_dict(raw, source="test")
    torch.manual_seed(0)
    fresh = config.build(data.n_items)
    torch.manual_seed(0)
    model = config.build(data.n_items)
    counts = warm_start_init(bundle, config, data)(model)
    assert counts["items"] == old.n_items
    assert counts["new_items"] == data.n_items - old.n_items
    new_rows = {str(item): row for row, item in enumerate(data.item_ids[1:].tolist(), start=1)}
    table, old_table = model.encoder.item_emb.weight, old.model.encoder.item_emb.weight
    for row, item in enumerate(old.item_ids.tolist(), start=1):
        assert torch.equal(table[new_rows[item]], old_table[row])
    for item, row in new_rows.items():
        if item not in set(old.item_ids.tolist()):
            assert torch.equal(table[row], fresh.encoder.item_emb.weight[row])  # as a model built from scratch
    for name, tensor in model.state_dict().items():
        if "emb" not in name and name != "encoder.item_features":
            assert torch.equal(tensor, old.model.state_dict()[name]), name


def test_cli_warm_start_trains_and_records_its_origin(folders: tuple[Path, Path, Path], tmp_path: Path) -> None:
    full, _, bundle = folders
    out = tmp_path / "warm"
    assert main(["train", "--data", str(full), "--out", str(out), "--init-from", str(bundle), *TINY, *FEATURES,
                 "-q"]) == 0
    training = read_manifest(out).training
    assert training is not None
    assert training["warm_start_from"] == str(bundle)
    assert json.loads((out / "config.json").read_text())["model"]["item_features"] == "genres"


def test_warm_start_refuses_another_model_size(folders: tuple[Path, Path, Path], tmp_path: Path,
                                                capsys: pytest.CaptureFixture) -> None:
    full, _, bundle = folders
    code = main(["train", "--data", str(full), "--out", str(tmp_path / "x"), "--init-from", str(bundle), *TINY,
                 *FEATURES, "--model.d_model", "32", "-q"])
    assert code == 1
    err = capsys.readouterr().err
    assert "warm start needs the same" in err
    assert len(err.strip().splitlines()) == 1


def test_warm_start_from_another_catalogue_is_refused(folders: tuple[Path, Path, Path], tmp_path: Path,
                                                      capsys: pytest.CaptureFixture) -> None:
    """No item carried over, and the run went on with an INFO line ("0 of 1682 items carried over")."""
    _, _, bundle = folders
    log = tmp_path / "log.csv"
    log.write_text("user,item,ts\n" + "".join(f"u{u},x{(u + t) % 7},{t}\n" for u in range(30) for t in range(5)))
    other, out = tmp_path / "other", tmp_path / "warm"
    assert main(["prepare", "--dataset", "csv", "--path", str(log), "--user-col", "user", "--item-col", "item",
                 "--time-col", "ts", "--out", str(other), "-q"]) == 0
    capsys.readouterr()
    assert main(["train", "--data", str(other), "--out", str(out), "--init-from", str(bundle), *TINY, "-q"]) == 1
    n_old = load_artifact(bundle, with_index=False).n_items
    assert capsys.readouterr().err.strip().splitlines() == [
        f"seqrec: error: --init-from {bundle}: none of its {n_old} item ids is in {other} (7 items, e.g. 'x0'); a "
        "warm start carries item rows over by id, so it needs a bundle trained on this catalogue (or an earlier "
        "state of it)"]
    assert not out.exists()


def test_cold_start_bench_ranks_the_held_out_items_through_the_catalogue_change(folders: tuple[Path, Path, Path],
                                                                              tmp_path: Path) -> None:
    from offline.bench.quality.cold_start import main as cold_start

    full, held, bundle = folders
    assert cold_start(["evaluate", "--data", str(full), "--split", str(held.parent), "--artifact", str(bundle),
                       "--out", str(tmp_path / "res")]) == 0
    record = json.loads((tmp_path / "res" / "results.json").read_text())
    data = load_prepared(full)
    held_ids = set(data.item_ids[1:]) - set(load_prepared(held).item_ids[1:])
    last = data.item_ids[data.sequences.items[data.sequences.offsets[1:] - 1]]
    assert record["test_users"] == sum(str(i) in held_ids for i in last)
    assert record["catalogue_items"] == load_artifact(bundle, with_index=False).n_items + record["items_with_vectors"]
    results = record["results"]
    assert set(results) == {"item features (POST /admin/items)", "random vector", "popularity"}
    assert results["popularity"]["HR@50"] == 0.0  # a new item has no training count: last, behind every tie


def test_pipeline_takes_catalogue_changes_into_the_next_training_and_warm_starts(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import yaml

    from service.system.catalog import JOURNAL, CatalogChanges, load_served, pending, read_journal, write_journal

    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump({
        "model": {"backbone": "transformer", "d_model": 16, "n_layers": 1, "n_heads": 2, "max_len": 10,
                  "item_features": "genres"},
        "train": {"epochs": 2, "batch_size": 64, "seed": 3, "threads": 1}}))
    config = tmp_path / "pipeline.yaml"
    config.write_text(yaml.safe_dump({
        "name": "tiny", "retriever": "tiny.yaml", "ranker": {"kind": "none"},
        "data": {"dataset": "synthetic", "synthetic": {"n_users": 150, "n_items": 60, "mean_length": 12, "seed": 1}},
        "warm_start_overrides": {"train.epochs": 1}}))
    artifacts = tmp_path / "artifacts"
    # the first run of a warm-starting cron job has nothing to start from: it says so (it said nothing)
    assert main(["pipeline", "--config", str(config), "--out", str(artifacts), "--warm-start", "-q"]) == 0
    assert f"warm start: {artifacts / 'current'} serves no bundle yet; training from scratch" in caplog.text
    first = (artifacts / "current").resolve()
    assert json.loads((first / "pipeline.json").read_text())["stages"]["train"]["warm_start_from"] is None
    write_journal(first, CatalogChanges(added=[{"item_id": "brand-new", "genres": ["Comedy"], "title": "New"}],
                                        retired=["i1"]))
    assert main(["pipeline", "--config", str(config), "--out", str(artifacts), "--warm-start", "-q"]) == 0
    second = (artifacts / "current").resolve()
    assert second != first
    record = json.loads((second / "pipeline.json").read_text())
    assert record["stages"]["train"]["warm_start_from"] == str(first)
    assert record["stages"]["prepare"]["added_items"] == 1
    assert json.loads((second / "config.json").read_text())["train"]["epochs"] == 1  # warm_start_overrides
    served = load_served(second)
    assert "brand-new" in served.index_of  # trained with the catalogue now, not an addition
    assert served.index_of["brand-new"] <= load_artifact(second, with_index=False).n_items
    assert read_journal(second).retired == ["i1"]
    assert pending(served) == []  # its journal row stays (a rollback to the first version serves it from it)
    assert served.index_of["i1"] in served.retired
    assert (artifacts / JOURNAL).is_file()  # beside the versions, not in one
    assert not (second / JOURNAL).exists()


def test_added_items_stay_through_every_retraining_and_one_added_mid_run_is_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An item added through POST /admin/items was trained by the next run and gone after the one after (the
    source data never has it); one added while a run trained was lost when that run published."""
    import yaml

    import offline.jobs.pipeline as pipeline
    from service.system.catalog import CatalogChanges, load_served, pending, read_journal, write_journal

    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump({
        "model": {"backbone": "transformer", "d_model": 16, "n_layers": 1, "n_heads": 2, "max_len": 10},
        "train": {"epochs": 1, "batch_size": 64, "seed": 3, "threads": 1}}))
    config = tmp_path / "pipeline.yaml"
    config.write_text(yaml.safe_dump({
        "name": "tiny", "retriever": "tiny.yaml", "ranker": {"kind": "none"},
        "data": {"dataset": "synthetic", "synthetic": {"n_users": 150, "n_items": 60, "mean_length": 12, "seed": 1}}}))
    artifacts = tmp_path / "artifacts"
    run = ["pipeline", "--config", str(config), "--out", str(artifacts), "-q"]
    assert main(run) == 0
    write_journal((artifacts / "current").resolve(),
                  CatalogChanges(added=[{"item_id": "brand-new", "title": "New", "genres": ["Comedy"]}]))
    assert main(run) == 0  # trains brand-new
    train = pipeline._train

    def add_while_training(*args, **kwargs):  # type: ignore[no-untyped-def]
        served = (artifacts / "current").resolve()
        write_journal(served, CatalogChanges(added=[{"item_id": "late", "title": "Late", "genres": ["Drama"]}],
                                             retired=["i2"]))
        return train(*args, **kwargs)

    monkeypatch.setattr(pipeline, "_train", add_while_training)
    assert main(run) == 0
    third = (artifacts / "current").resolve()
    served = load_served(third)
    assert "brand-new" in served.index_of  # trained again: the source data never has it
    assert served.index_of["brand-new"] <= load_artifact(third, with_index=False).n_items
    assert json.loads((third / "pipeline.json").read_text())["stages"]["prepare"]["admin_items"] == ["brand-new"]
    assert read_journal(third).added_ids == ["late"]  # still pending (an ID-only model has no vector for it yet)
    assert pending(served) == ["late"]
    assert served.retired == {served.index_of["i2"]}
    monkeypatch.setattr(pipeline, "_train", train)
    assert main(run) == 0
    fourth = load_served((artifacts / "current").resolve())
    assert {"brand-new", "late"} <= set(fourth.index_of)
    assert sorted(json.loads((fourth.path / "pipeline.json").read_text())["stages"]["prepare"]["admin_items"]) == [
        "brand-new", "late"]
    assert pending(fourth) == []
    assert fourth.retired == {fourth.index_of["i2"]}
