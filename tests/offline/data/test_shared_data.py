"""The real benchmark copies in ../shared/data (development only; never shipped).

They sit beside the checkout on the project's machines and in CI; elsewhere these tests skip.
"""

import json

import pytest

from offline.cli import main
from tests.offline.conftest import SHARED_DATA

CASES = [
    ("ml-100k", SHARED_DATA / "ml-100k", (943, 1682, 100_000)),  # RecBole atomic files
    ("ml-100k", SHARED_DATA / "ml-100k" / "raw", (943, 1682, 100_000)),  # GroupLens files
    ("s3rec", SHARED_DATA / "amazon-beauty", (22_363, 12_101, 198_502)),
]


@pytest.mark.parametrize(("dataset", "path", "counts"), CASES, ids=["ml-100k-recbole", "ml-100k-raw", "beauty"])
def test_prepare_reports_the_published_counts(dataset, path, counts, tmp_path, capsys):
    if not path.is_dir():
        pytest.skip(f"{path} not present")
    out = tmp_path / "prepared"
    assert main(["-q", "prepare", "--dataset", dataset, "--path", str(path), "--out", str(out)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert (manifest["users"], manifest["items"], manifest["interactions"]) == counts
    users, items, interactions = counts
    assert f"{users:,} users, {items:,} items, {interactions:,} interactions" in capsys.readouterr().out


def test_both_ml100k_copies_give_the_same_sequences_and_baseline(tmp_path, capsys):
    if not (SHARED_DATA / "ml-100k" / "raw").is_dir():
        pytest.skip("ml-100k not present")
    results = []
    for name, path in [("a", SHARED_DATA / "ml-100k"), ("b", SHARED_DATA / "ml-100k" / "raw")]:
        main(["-q", "prepare", "--dataset", "ml-100k", "--path", str(path), "--out", str(tmp_path / name)])
        capsys.readouterr()
        assert main(["-q", "evaluate", "--model", "popularity", "--data", str(tmp_path / name)]) == 0
        results.append(json.loads(capsys.readouterr().out))
    assert results[0]["valid"] == results[1]["valid"]
    assert results[0]["test"] == results[1]["test"]
    # Popularity is far from useless on MovieLens but far from perfect.
    assert 0.02 < results[0]["test"]["HR@10"] < 0.3
