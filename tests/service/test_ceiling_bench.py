"""`python -m offline.bench.compute.ceiling` on the served test bundle: FLOP counts, CPU costs and the cores they
imply."""

import json
from pathlib import Path

import pytest

from common.errors import SeqrecError
from offline.bench.compute.ceiling import BATCHES, encoder_flop, main
from service.system.loader import load_bundle


def test_the_encoder_flop_count_grows_with_the_history(bundle: Path) -> None:
    served = load_bundle(bundle)
    flop = encoder_flop(served.artifact.model, [1, 10, 20, 10], served.n_items)
    assert sorted(flop) == [1, 10, 20]
    assert 0 < flop[1] < flop[10] < flop[20]


def test_the_report_states_the_costs_and_the_cores_at_half_the_noop_rate(bundle: Path, tmp_path: Path) -> None:
    serve = tmp_path / "serve.json"
    serve.write_text(json.dumps({"targets": {
        bundle.name: {"bundle": str(bundle), "noop": {"max_rate_p99_50ms": 100.0},
                      "service": {"max_rate_p99_50ms": 20.0}},
        "other": {"bundle": "/elsewhere/other", "noop": {"max_rate_p99_50ms": 900.0},
                  "service": {"max_rate_p99_50ms": 1.0}}}}))
    out = tmp_path / "out"
    assert main(["--artifact", str(bundle), "--out", str(out), "--serve", str(serve), "--requests", "8",
                 "--min-len", "1", "--max-len", "20", "--candidates", "10", "--rounds", "1"]) == 0
    (report,) = json.loads((out / "ceiling.json").read_text())["bundles"]
    assert report["encoder_mflop"] > 0
    assert report["gemm_gflops"] > 0
    assert 1 <= report["mean_history"] <= 20
    assert [row["batch"] for row in report["rows"]] == list(BATCHES)
    for row in report["rows"]:
        assert 0 < row["encoder_ms"] < row["model_ms"]  # the model path holds the encoder
    needs = report["serve"]
    assert (needs["noop_max_rate"], needs["half_rate"], needs["seqrec_max_rate"]) == (100.0, 50.0, 20.0)
    assert needs["model_cores"] == round(50.0 * report["rows"][-1]["model_ms"] / 1000, 2)
    text = (out / "ceiling.md").read_text()
    assert f"| {bundle.name} | 100.0 | 50.0 | 20.0 |" in text
    assert "run in `../serve.json`" in text  # the serve file, named from the output folder


def test_a_serve_file_without_the_bundle_adds_nothing_and_an_unreadable_one_is_refused(bundle: Path,
                                                                                      tmp_path: Path) -> None:
    serve = tmp_path / "serve.json"
    serve.write_text(json.dumps({"targets": {}}))
    args = ["--artifact", str(bundle), "--out", str(tmp_path / "out"), "--requests", "4", "--min-len", "1",
            "--max-len", "5", "--candidates", "5", "--rounds", "1"]
    assert main([*args, "--serve", str(serve)]) == 0
    (report,) = json.loads((tmp_path / "out" / "ceiling.json").read_text())["bundles"]
    assert report["serve"] is None
    serve.write_text("{not json")
    with pytest.raises(SeqrecError, match="cannot read it"):
        main([*args, "--serve", str(serve)])
