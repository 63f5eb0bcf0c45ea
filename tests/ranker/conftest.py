"""The tiny prepared data and the retriever bundle the ranker tests rerank (one of each per test module)."""

from pathlib import Path

import pytest

from tests.tiny import prepare_tiny, train_tiny


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return prepare_tiny(tmp_path_factory.mktemp("data") / "synthetic")


@pytest.fixture(scope="module")
def bundle(prepared: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_tiny(prepared, tmp_path_factory.mktemp("bundles") / "b")
