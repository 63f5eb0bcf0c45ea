"""`python -m offline.bench.compute.encoder_lengths` on the served test bundle: both encoder paths and both
history-cosine paths on the same batches."""

import json
from pathlib import Path

from offline.bench.compute.encoder_lengths import BATCHES, main


def test_the_bench_times_both_paths_on_mixed_lengths_and_finds_the_same_values(bundle: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert main(["--artifact", str(bundle), "--out", str(out), "--requests", "32", "--min-len", "1",
                 "--max-len", "20", "--rounds", "1", "--candidates", "10"]) == 0
    report = json.loads((out / f"encoder-{bundle.name}.json").read_text())
    assert [r["batch"] for r in report["rows"]] == list(BATCHES)
    for row in report["rows"]:
        assert row["padded_ms"] > 0
        assert row["grouped_ms"] > 0
        assert row["max_abs_diff"] <= 1e-5
        assert row["cosines_padded_ms"] > 0
        assert row["cosines_grouped_ms"] > 0
        assert row["cosines_identical"] is True
    assert report["rows"][0]["max_abs_diff"] == 0  # one history: the very same call
    assert "| 32 |" in (out / f"encoder-{bundle.name}.md").read_text()
