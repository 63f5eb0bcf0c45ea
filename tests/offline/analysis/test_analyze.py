"""`seqrec analyze` end to end on two tiny models: the report renders, its numbers agree with `seqrec evaluate`,
the predictions are the retriever's and the ranker's orders, and mistakes leave the old report in place."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from offline.analysis.analyze import item_vectors
from offline.analysis.geometry import linear_cka
from offline.analysis.report import render_html
from offline.cli import main
from offline.data.prepared import load_prepared
from retriever.artifact import load_artifact, read_manifest

TINY = ["--model.d_model", "16", "--model.n_layers", "1", "--model.max_len", "10", "--train.epochs", "3",
        "--train.batch_size", "64", "--threads", "1", "--seed", "3", "-q"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("analyze")
    data = root / "data"
    assert main(["prepare", "--dataset", "synthetic", "--n-users", "150", "--n-items", "60", "--mean-length", "12",
                 "--seed", "1", "--out", str(data), "-q"]) == 0
    transformer, gru = root / "transformer", root / "gru"
    assert main(["train", "--data", str(data), "--out", str(transformer), "--model.n_heads", "2", *TINY]) == 0
    assert main(["train", "--data", str(data), "--out", str(gru), "--model.backbone", "gru4rec", *TINY]) == 0
    assert main(["train-ranker", "--artifact", str(transformer), "--data", str(data), "--kind", "lgbm",
                 "--mining", "direct", "--depth", "20", "-q"]) == 0
    report = root / "report"
    assert main(["analyze", "--artifact", str(transformer), "--compare", str(gru), "--data", str(data),
                 "--out", str(report), "--tsne-items", "40", "--threads", "1", "-q"]) == 0
    return {"data": data, "transformer": transformer, "gru": gru, "report": report, "root": root}


def _report(setup: dict[str, Path]) -> dict:
    return json.loads((setup["report"] / "report.json").read_text())


def test_report_renders_every_figure_as_a_valid_png(setup: dict[str, Path]) -> None:
    page = (setup["report"] / "report.html").read_text()
    pngs = sorted(p.name for p in setup["report"].glob("*.png"))
    assert pngs == sorted(["spectrum.png", "hubness.png", "norms.png", "tsne.png", "cka.png", "popularity.png",
                           "length.png", "curves.png"])
    for name in pngs:
        assert f"src='{name}'" in page
        with Image.open(setup["report"] / name) as image:
            image.verify()  # raises on a broken file
            assert image.format == "PNG"
            assert min(image.size) > 100
    assert "Item " in page  # readable titles from items.parquet


def test_breakdown_and_geometry_agree_with_the_artifacts(setup: dict[str, Path]) -> None:
    report = _report(setup)
    data = load_prepared(setup["data"])
    labels = ["transformer", "gru"]
    assert [m["label"] for m in report["models"]] == labels
    for label in labels:
        manifest = read_manifest(setup[label])
        for table in ("popularity", "length"):
            rows = report["breakdown"][table]["models"][label]
            assert sum(r["users"] for r in rows) == data.n_users
            # The users' groups partition everyone, so the user-weighted mean is the model's test NDCG@10.
            mean = sum(r["users"] * (r["NDCG@10"] or 0.0) for r in rows) / data.n_users
            assert mean == pytest.approx(manifest.metrics["test"]["NDCG@10"], abs=2e-6)
        geometry = report["geometry"][label]
        assert geometry["n_items"] == data.n_items
        assert sum(geometry["hubness"]["k_occurrence"]) == data.n_items * 10
        assert manifest.training is not None
        assert len(report["curves"][label]) == manifest.training["epochs_run"]
    cka = np.array(report["cka"]["matrix"])
    assert np.allclose(cka, cka.T)
    assert np.allclose(np.diag(cka), 1.0)
    # the two models' own item vectors, in the report's order (linear_cka itself: test_geometry.py)
    first, second = (item_vectors(load_artifact(setup[label])) for label in labels)
    assert cka[0, 1] == pytest.approx(linear_cka(first, second), abs=1e-6)
    assert cka[0, 1] < 0.999  # two trainings, two geometries
    assert set(report["tsne"]["models"]) == set(labels)
    assert all(len(xy) == 40 for xy in report["tsne"]["models"].values())


def test_predictions_show_the_retriever_and_the_reranked_order(setup: dict[str, Path]) -> None:
    report = _report(setup)
    data = load_prepared(setup["data"])
    split = data.split()
    artifact = load_artifact(setup["transformer"])
    rows = {str(u): i for i, u in enumerate(data.user_ids)}
    assert len(report["predictions"]) == 5
    for user in report["predictions"]:
        lists = user["lists"]
        assert set(lists["transformer"]) == {"retriever", "reranked"}  # it holds a ranker
        assert set(lists["gru"]) == {"retriever"}
        row = rows[user["user_id"]]
        history = split.inputs("test").row(row)
        target = int(split.test_targets[row])
        # The retriever's order is the full ranking's top 10 (the index is exact), under the bundle's repeat
        # policy: the whole history removed, or nothing.
        with torch.no_grad():
            scores = artifact.model.score(torch.from_numpy(history[-artifact.max_len:])[None])[0]
        scores[0] = -torch.inf
        if artifact.manifest.exclude_seen:
            scores[torch.from_numpy(history)] = -torch.inf
        expected = [str(data.item_ids[i]) for i in torch.argsort(scores, descending=True, stable=True)[:10].tolist()]
        assert [e["id"] for e in lists["transformer"]["retriever"]] == expected
        reranked = [e["id"] for e in lists["transformer"]["reranked"]]
        assert len(reranked) == len(set(reranked)) == 10
        assert [e["is_target"] for e in lists["transformer"]["reranked"]] == [i == str(data.item_ids[target])
                                                                             for i in reranked]
        assert [e["id"] for e in user["recent_history"]] == [str(data.item_ids[i]) for i in history[-10:]]


def test_html_escapes_text_from_the_data() -> None:
    record = {"user_id": "<u>", "history_length": 1, "target": {"title": "<script>x</script>", "meta": ""},
              "recent_history": [{"title": "a & b", "meta": "genres: <i>"}],
              "lists": {"m": {"retriever": [{"title": "<b>", "meta": "", "is_target": True}]}}}
    report = {"data": {"path": "<p>", "users": 1, "items": 1}, "models": [], "predictions": [record],
              "geometry": {"m": {"n_items": 1, "dim": 1, "spectrum": {"dims_for_90": 1}, "participation_ratio": 1.0,
                                 "twonn_dimension": 1.0, "anisotropy": 0.0, "norms": {"mean": 1.0, "std": 0.0},
                                 "hubness": {"k": 1, "skewness": 0.0, "gini": 0.0, "max": 1}}},
              "breakdown": {"split": "test", "k": 10, "head": {"items": 1, "catalogue": 1, "interaction_share": 1.0,
                                                               "share": 0.2},
                            "popularity": {"models": {}}, "length": {"models": {}}}}
    page = render_html(report, [])
    assert "<script>" not in page
    assert "&lt;script&gt;x&lt;/script&gt;" in page
    assert "a &amp; b" in page
    assert "<b>←" in page  # the target mark is the page's own markup


def test_mistakes_exit_1_and_keep_the_previous_report(setup: dict[str, Path], tmp_path: Path,
                                                      capsys: pytest.CaptureFixture) -> None:
    report = setup["report"]
    before = (report / "report.json").read_bytes()
    base = ["analyze", "--artifact", str(setup["transformer"]), "--data", str(setup["data"]), "--out", str(report)]
    other = tmp_path / "other"
    assert main(["prepare", "--dataset", "synthetic", "--n-users", "80", "--n-items", "30", "--seed", "2",
                 "--out", str(other), "-q"]) == 0
    cases = [
        (["--user-ids", "nobody"], "unknown user id"),
        (["--head-share", "1.5"], "--head-share"),
        (["--length-edges", "5,x"], "--length-edges"),
        (["--k", "1000"], "--k must be below"),
    ]
    for extra, message in cases:
        assert main([*base, *extra, "-q"]) == 1
        err = capsys.readouterr().err
        assert message in err
        assert "Traceback" not in err
    assert main(["analyze", "--artifact", str(setup["transformer"]), "--data", str(other), "--out", str(report),
                 "-q"]) == 1
    assert "different item catalogue" in capsys.readouterr().err
    assert (report / "report.json").read_bytes() == before
    # the report replaces --out as a whole: a folder that is not a report (here a prepared dataset) is refused
    assert main([*base[:-1], str(other), "-q"]) == 1
    assert f"{other}: holds files that are not a seqrec analyze report" in capsys.readouterr().err
    assert load_prepared(other).n_items == 30
    # inside a dataset or a bundle: the report would sit where `prepare --overwrite` or an export replaces the folder
    for home in (setup["data"], setup["transformer"]):
        assert main([*base[:-1], str(home / "report"), "-q"]) == 1
        assert f"is inside {home}" in capsys.readouterr().err
        assert not (home / "report").exists()
    none = tmp_path / "no-users"
    assert main([*base[:-1], str(none), "--users", "0", "--tsne-items", "20", "-q"]) == 0  # no predictions section
    assert json.loads((none / "report.json").read_text())["predictions"] == []
    assert sorted(p.name for p in setup["root"].iterdir() if p.name.startswith(".report")) == []  # no staging left
