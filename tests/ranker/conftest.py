"""The tiny prepared data and the retriever bundle the ranker tests rerank (one of each per test module)."""

from pathlib import Path

import pytest

from offline.cli import main
from tests.tiny import TINY, prepare_tiny


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return prepare_tiny(tmp_path_factory.mktemp("data") / "synthetic")


@pytest.fixture(scope="module")
def bundle(prepared: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bundles") / "b"
    assert main(["train", "--data", str(prepared), "--out", str(out), *TINY, "-q"]) == 0
    return out
