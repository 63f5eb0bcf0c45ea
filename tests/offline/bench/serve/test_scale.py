"""`seqrec bench scale`: the slope fit on hand-made power laws, a tiny real run of all three curves
(training processes, uvicorn servers, open-loop load), and one-line errors for bad options."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib.image
import pytest

from common.errors import SeqrecError
from offline.bench.serve.scale import parse_sizes
from offline.bench.serve.scale_report import TABLE_COPIES, slopes
from offline.cli import main

CONFIG = Path(__file__).resolve().parents[4] / "configs" / "synthetic" / "transformer.yaml"
TINY = ["--config", str(CONFIG), "--interactions", "2000,8000", "--train-items", "1000", "--catalogues", "500,2000",
        "--duration", "2", "--rate", "20", "--warmup", "0.5", "--memory-steps", "3", "--valid-users", "32", "-q"]


def test_slopes_recover_hand_made_power_laws() -> None:
    points: list[dict[str, Any]] = [{"n": n, "linear": 3.0 * n, "square": 0.5 * n**2, "root": 7.0 / n**0.5, "flat": 4.0}
              for n in (10, 100, 1000, 10_000)]
    fitted = slopes(points, "n", ["linear", "square", "root", "flat"])
    assert fitted == pytest.approx({"linear": 1.0, "square": 2.0, "root": -0.5, "flat": 0.0}, abs=1e-9)


def test_slopes_skip_missing_and_non_positive_values() -> None:
    points: list[dict[str, Any]] = [{"n": 1, "y": 0.0}, {"n": 10, "y": 5.0}, {"n": 100, "y": 500.0}, {"n": 1000},
                                    {"n": 10_000, "y": None}]
    assert slopes(points, "n", ["y"]) == {"y": 2.0}  # only (10, 5) and (100, 500) are usable
    assert slopes(points[:2], "n", ["y"]) == {"y": None}  # one usable point: no slope


def test_sizes_accept_scientific_notation_and_sort() -> None:
    assert parse_sizes("1e6, 1e4,100000,1e4", "--x") == [10_000, 100_000, 1_000_000]
    for bad in ("", "1.5e0", "0", "-3", "ten", "nan"):
        with pytest.raises(SeqrecError):
            parse_sizes(bad, "--x")


def test_tiny_run_writes_every_curve(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "scale"
    assert main(["bench", "scale", "--out", str(out), *TINY]) == 0
    assert "scale.md" in capsys.readouterr().out
    for name in ("scale.json", "scale.md", "train_time.png", "serve_p99.png", "memory.png"):
        assert (out / name).is_file(), name
    for name in ("train_time.png", "serve_p99.png", "memory.png"):
        image = matplotlib.image.imread(out / name)
        assert image.ndim == 3
        assert min(image.shape[:2]) > 100
    assert not (out / "work").exists()  # removed without --keep-work

    report = json.loads((out / "scale.json").read_text())
    assert report["command"].startswith("seqrec bench scale --out ")
    train, serve, memory = report["train"], report["serve"], report["memory"]
    assert not any("error" in curve for curve in (train, serve, memory))

    assert [p["interactions_requested"] for p in train["points"]] == [2000, 8000]
    first, second = train["points"]
    assert first["interactions"] < second["interactions"]
    assert first["users"] < second["users"]
    for point in train["points"]:
        assert point["epoch_seconds"] > 0
        assert point["steps"] >= 1
        assert point["peak_rss_mb"] >= point["rss_before_fit_mb"] > 0
        assert point["items_seen"] <= 1000
        assert point["torch_threads"] == 1
        assert 0 <= point["valid_sample"]["NDCG@10"] <= 1
    assert isinstance(train["slopes"]["epoch_seconds"], float)

    assert [p["n_items"] for p in serve["points"]] == [500, 2000]
    for point in serve["points"]:
        assert point["index"]["kind"] == "flat"
        assert point["ok"] > 0
        assert 0 < point["p50_ms"] <= point["p99_ms"]
        assert point["server_rss_mb"] > 0
        assert point["bundle_mb"] > 0
    assert serve["points"][0]["bundle_mb"] < serve["points"][1]["bundle_mb"]
    assert isinstance(serve["slopes"]["p99_ms"], float)

    assert [p["n_items"] for p in memory["points"]] == [500, 2000]
    assert memory["points"][0]["steps"] == memory["points"][1]["steps"]  # the same data and batch at each size
    for point in memory["points"]:
        assert point["expected_tables_mb"] == pytest.approx(TABLE_COPIES * (point["n_items"] + 1) * 64 * 4 / 2**20,
                                                            abs=0.01)
        assert point["server_rss_mb"] == next(p["server_rss_mb"] for p in serve["points"]
                                              if p["n_items"] == point["n_items"])
    assert memory["points"][0]["extra_mb"] == 0

    text = (out / "scale.md").read_text()
    for heading in ("## Training time against interactions", "## Serving latency against catalogue size",
                    "## Memory against catalogue size", "Log-log slopes against"):
        assert heading in text


@pytest.mark.parametrize(("options", "message"), [
    (["--interactions", "0"], "--interactions"),
    (["--catalogues", "1e4,abc"], "'abc' is not a number"),
    (["--curves", "train,speed"], "--curves"),
    (["--rate", "-5"], "--rate"),
    (["--min-len", "60", "--max-len", "50"], "--min-len"),
    (["--catalogues", "30"], "--max-len"),
    (["--train-items", "1"], "--train-items"),  # a synthetic catalogue needs 2 items
    (["--set", "train.lr=-1"], "lr"),
])
def test_bad_options_fail_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], options: list[str],
                                        message: str) -> None:
    assert main(["bench", "scale", "--out", str(tmp_path / "scale"), "--config", str(CONFIG), *options]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("seqrec: error:")
    assert "\n" not in err
    assert message in err
    assert not (tmp_path / "scale").exists()  # refused before anything ran
