"""`seqrec pipeline --protocol temporal` end to end on tiny timed data: the ranker's training rows all lie before the
validation cut, the test window is retrieved and scored once (by the evaluation), the published bundle's record
is what the same served system gives again, and data without timestamps is refused before any stage trains."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from offline.cli import main
from offline.data.prepared import load_prepared
from offline.data.temporal import TemporalProtocol
from offline.jobs import evaluate as evaluation
from offline.jobs import rank as ranking
from offline.jobs.evaluate_temporal import evaluate_bundle_temporal
from offline.jobs.pipeline import run_pipeline
from offline.jobs.pipeline_config import load_pipeline_config, with_split
from ranker.mining import Mined

TINY_RETRIEVER = {
    "model": {"backbone": "transformer", "d_model": 16, "n_layers": 1, "n_heads": 2, "max_len": 10},
    "train": {"epochs": 3, "batch_size": 64, "seed": 3, "threads": 1},
}
# ten days of the synthetic clock: users come back across the cuts, so both windows hold warm users
TIMED = {"n_users": 150, "n_items": 60, "mean_length": 12, "seed": 1, "days": 10}


def _config(tmp_path: Path, *, mining: str = "holdout", split: dict[str, Any] | None = None,
            data: dict[str, Any] | None = None, features: tuple[str, ...] = ("cooc_last1", "recent_7d")) -> Path:
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(TINY_RETRIEVER))
    config: dict[str, Any] = {
        "name": "tiny", "data": data or {"dataset": "synthetic", "synthetic": TIMED}, "retriever": "tiny.yaml",
        "ranker": {"kind": "lgbm", "mining": mining, "depth": 20, "features": list(features)}}
    if split is not None:
        config["split"] = split
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A temporal pipeline run with holdout mining, every mining and every retrieval of it recorded."""
    tmp_path = tmp_path_factory.mktemp("temporal-pipeline")
    mined: list[dict[str, Mined]] = []
    retrieved: list[str] = []
    real_mine_splits, real_mine = ranking.mine_splits, evaluation.mine
    with pytest.MonkeyPatch.context() as patch:
        def mine_splits(*args: Any, **kwargs: Any) -> dict[str, Mined]:
            mined.append(real_mine_splits(*args, **kwargs))
            return mined[-1]

        def mine(*args: Any, **kwargs: Any) -> Mined:
            retrieved.append(kwargs["desc"])
            return real_mine(*args, **kwargs)

        patch.setattr(ranking, "mine_splits", mine_splits)
        for module in (ranking, evaluation):
            patch.setattr(module, "mine", mine)
        summary = run_pipeline(_config(tmp_path), tmp_path / "artifacts", threads=1,
                               split={"protocol": "temporal"})
    return {"summary": summary, "mined": mined, "retrieved": retrieved, "artifacts": tmp_path / "artifacts"}


def test_the_ranker_learns_from_positions_before_the_validation_cut_only(published: dict[str, Any]) -> None:
    bundle = Path(published["summary"].path)
    (mined,) = published["mined"]
    assert set(mined) == {"train", "valid"}  # no test groups: the test window is left to the evaluation
    record = json.loads((bundle / "pipeline.json").read_text())
    split = record["stages"]["prepare"]["split"]
    valid_cut = split["valid"]["cut"]
    prepared = _prepared_again(published["artifacts"])
    train = TemporalProtocol().split_data(prepared).train
    assert train.timestamps is not None
    target_times = train.timestamps[mined["train"].end]  # a training target is items[end] of the training rows
    history_times = train.timestamps[mined["train"].end - 1]
    assert len(target_times) > 0
    assert (target_times < valid_cut).all()
    assert (history_times < valid_cut).all()
    manifest = json.loads((bundle / "ranker" / "manifest.json").read_text())
    assert manifest["mining"]["train_mined_by"] == "holdout"
    assert "test" not in manifest["metrics"]  # the ranker's record: its validation window only


def test_the_test_window_is_retrieved_and_scored_once(published: dict[str, Any]) -> None:
    assert [desc for desc in published["retrieved"] if "test" in desc] == ["retrieve test"]
    assert "mine test" not in published["retrieved"]


def test_the_published_record_is_what_the_served_system_gives(published: dict[str, Any],
                                                              capsys: pytest.CaptureFixture) -> None:
    bundle = Path(published["summary"].path)
    evaluated = published["summary"].evaluation
    assert evaluated["system"] == "two-stage"
    assert evaluated["protocol"]["protocol"] == "temporal"
    test = evaluated["temporal"]["test"]
    assert {"users", "cold_users", "new_items", "new_item_targets", "window_recall"} <= set(test)
    assert 0.0 <= test["window_recall"]["Recall@10"] <= 1.0
    again = evaluate_bundle_temporal(bundle, _prepared_again(published["artifacts"]), TemporalProtocol())
    assert again["test"] == evaluated["test"]
    assert again["valid"] == evaluated["valid"]
    assert again["temporal"]["test"]["window_recall"] == test["window_recall"]
    assert evaluated["temporal"]["valid"]["users"] == len(published["mined"][0]["valid"])
    data = _prepared_again(published["artifacts"]).path
    capsys.readouterr()
    assert main(["evaluate", "--artifact", str(bundle), "--data", str(data), "--protocol", "temporal", "-q"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["stage"] == "two-stage"
    assert printed["test"] == evaluated["test"]


def test_direct_mining_under_the_config_split_section(tmp_path: Path) -> None:
    summary = run_pipeline(_config(tmp_path, mining="direct", split={"protocol": "temporal", "valid_cut": 0.8}),
                           tmp_path / "artifacts", threads=1)
    record = json.loads((Path(summary.path) / "ranker" / "manifest.json").read_text())
    assert record["mining"]["train_mined_by"] == "retriever"
    assert summary.evaluation["protocol"] == {"protocol": "temporal", "valid_cut": "0.8", "test_cut": "0.9",
                                              "refit": False}


def test_the_command_line_overrides_the_config_section(tmp_path: Path) -> None:
    config = load_pipeline_config(_config(tmp_path, split={"protocol": "temporal", "test_cut": "0.95"}))
    assert with_split(config, {"valid_cut": "0.7"}).split.model_dump() == {  # type: ignore[union-attr]
        "protocol": "temporal", "valid_cut": "0.7", "test_cut": "0.95"}
    assert with_split(config, {"protocol": "loo"}).split is None
    with pytest.raises(Exception, match="applies to --protocol temporal"):
        with_split(config, {"protocol": "loo", "test_cut": "0.9"})


def test_data_without_timestamps_is_refused_before_training(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    source = tmp_path / "events.csv"
    source.write_text("user,item\n" + "".join(f"u{u},i{(u + k) % 7}\n" for u in range(30) for k in range(6)))
    data = {"dataset": "csv", "path": str(source), "reader": {"user_col": "user", "item_col": "item",
                                                              "time_col": None}}
    config = tmp_path / "p" / "pipeline.yaml"
    config.parent.mkdir()
    _config(config.parent, data=data, features=())  # no request-time feature, refused without a clock anyway
    out = tmp_path / "artifacts"
    assert main(["pipeline", "--config", str(config), "--out", str(out), "--protocol", "temporal", "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert "needs timestamps" in err
    assert len(err.splitlines()) == 1
    states = [json.loads(p.read_text()) for p in out.glob("work/*/state.json")]
    assert [sorted(s["stages"]) for s in states] == [[]]  # refused at the prepare stage, nothing trained


def _prepared_again(artifacts: Path) -> Any:
    """The run's prepared data, prepared again from the same config (the work folder goes at publish)."""
    from offline.data.prepare import Filters, prepare_dataset
    from offline.data.readers import ReaderOptions

    out = artifacts.parent / "prepared-again"
    if not out.exists():
        prepare_dataset("synthetic", out, ReaderOptions(path=None, synthetic=TIMED), Filters(3, None, None))
    return load_prepared(out)
