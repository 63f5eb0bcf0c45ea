"""offline.jobs.rank: where `seqrec train-ranker` keeps its holdout mining by default."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from offline.cli import main
from offline.jobs.rank import default_mining_dir
from offline.jobs.versions import VERSIONS, switch_current
from tests.tiny import TINY, prepare_tiny


def test_the_default_mining_folder_is_named_after_the_folder_a_link_names(tmp_path: Path) -> None:
    bundle = tmp_path / VERSIONS / "v1"
    bundle.mkdir(parents=True)
    assert default_mining_dir(bundle) == tmp_path / VERSIONS / "v1.mining"
    switch_current(tmp_path, bundle)
    assert default_mining_dir(tmp_path / "current") == (tmp_path / VERSIONS / "v1.mining").resolve()


def test_train_ranker_on_current_after_the_next_publish(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """`train-ranker --artifact ARTIFACTS/current` mined into ARTIFACTS/current.mining; once `current` named the
    next version, the same command was refused ("mined from retriever <old>, not <new>; mine again") with no flag
    to re-mine. Each version now gets its own cache, and a rollback reuses the old one."""
    data = prepare_tiny(tmp_path / "data")
    artifacts = tmp_path / "artifacts"
    bundles = []
    for seed in ("3", "4"):
        out = artifacts / VERSIONS / f"seed{seed}"
        assert main(["train", "--data", str(data), "--out", str(out), *TINY[:-1], seed, "-q"]) == 0
        bundles.append(out)
    capsys.readouterr()
    versions = [json.loads((b / "manifest.json").read_text())["version"] for b in bundles]
    assert versions[0] != versions[1]
    command = ["train-ranker", "--artifact", str(artifacts / "current"), "--data", str(data), "--kind", "lgbm",
               "--depth", "20", "--threads", "1", "-q"]
    for bundle, version in zip([*bundles, bundles[0]], [*versions, versions[0]], strict=True):
        switch_current(artifacts, bundle)
        assert main(command) == 0, capsys.readouterr().err
        mined = json.loads(capsys.readouterr().out)["mining"]
        assert mined["train_mined_by"] == "holdout"
        cache = artifacts / VERSIONS / f"{bundle.name}.mining"
        assert json.loads((cache / "mined.json").read_text())["retriever_version"] == version
        assert mined["holdout_version"] == json.loads((cache / "mined.json").read_text())["holdout_version"]
    assert not (artifacts / "current.mining").exists()
    # An explicitly given folder mined from another retriever is still refused.
    shutil.copytree(artifacts / VERSIONS / "seed4.mining", tmp_path / "other")
    assert main([*command, "--mined", str(tmp_path / "other")]) == 1
    assert capsys.readouterr().err.strip() == (f"seqrec: error: {tmp_path / 'other'} was mined from retriever "
                                               f"{versions[1]}, not {versions[0]}; mine again")
