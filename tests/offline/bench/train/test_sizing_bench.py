"""offline/bench/train/sizing.py: what the rules choose on a dataset, as a result file."""

from __future__ import annotations

import json
from pathlib import Path

from offline.bench.train.sizing import main


def test_sizing_only_writes_the_statistics_and_the_sized_values(tmp_path: Path) -> None:
    out = tmp_path / "sizing.json"
    assert main(["--dataset", "synthetic", "--n-users", "150", "--n-items", "60", "--mean-length", "12",
                 "--sizing-only", "--threads", "1", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    sizing = result["sizing"]
    assert sizing["statistics"]["users"] == 150
    assert sizing["given"] == {"train.threads": 1}
    assert sizing["sized"]["loss.name"] == "full"
    assert set(sizing["rules"]) == set(sizing["sized"])
    assert result["command"].startswith("python -m offline.bench.train.sizing --dataset synthetic")
    assert "load_average" in result["host_before"]
