"""Which folder a service serves (`resolve_bundle`), and that a bundle it cannot serve is a user error
(`BundleError`, a `SeqrecError`) naming the folder and why."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from common.errors import SeqrecError
from service.http.store import StoreUnavailable
from service.system.bundle import BundleError
from service.system.loader import load_bundle, resolve_bundle


def test_resolve_prefers_current(bundle: Path, tmp_path: Path) -> None:
    (tmp_path / "current").symlink_to(bundle, target_is_directory=True)
    assert resolve_bundle(tmp_path) == bundle.resolve()
    assert resolve_bundle(bundle) == bundle.resolve()  # a bundle folder itself


def test_resolve_names_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="no such folder"):
        resolve_bundle(tmp_path / "absent")
    with pytest.raises(BundleError, match="neither a bundle") as info:
        resolve_bundle(tmp_path)
    assert "did you mean" not in str(info.value)


def test_a_dangling_current_says_where_it_points(tmp_path: Path) -> None:
    (tmp_path / "current").symlink_to("versions/gone", target_is_directory=True)
    with pytest.raises(BundleError, match=r"current points at versions/gone, which does not exist$"):
        resolve_bundle(tmp_path)


def test_an_artifacts_folder_one_level_down_is_named(bundle: Path, tmp_path: Path) -> None:
    """`seqrec demo` publishes into artifacts/demo while `seqrec serve` reads artifacts by default."""
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "current").symlink_to(bundle, target_is_directory=True)
    (tmp_path / "other").mkdir()
    with pytest.raises(BundleError, match=rf"did you mean --artifacts {re.escape(str(tmp_path / 'demo'))}\?$"):
        resolve_bundle(tmp_path)


def test_a_changed_catalogue_is_refused(bundle: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(bundle, broken)
    (broken / "catalogue.parquet").write_bytes(b"not parquet")
    with pytest.raises(BundleError, match=r"catalogue\.parquet: checksum does not match"):
        load_bundle(broken)


def test_service_errors_share_the_error_root(tmp_path: Path) -> None:
    """The CLI prints a SeqrecError as one line; these two are user-fixable (a folder, a Redis)."""
    assert issubclass(BundleError, SeqrecError)
    assert issubclass(StoreUnavailable, SeqrecError)
    with pytest.raises(SeqrecError):
        resolve_bundle(tmp_path / "absent")
