"""atomic_write: a file written whole or not at all; replace_dir: a folder replaced as a whole, and never absent where
the kernel can swap two paths; switch_current: the published link only ever renamed over; exclusive: one holder of a
lock file at a time."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from common import atomic
from common.atomic import atomic_write, exclusive, replace_dir
from common.errors import SeqrecError
from offline.jobs.versions import CURRENT, switch_current


def _folder(path: Path, text: str) -> Path:
    path.mkdir()
    (path / "manifest.json").write_text(text)
    return path


def test_a_write_that_fails_keeps_the_old_file_and_leaves_no_temp_file(tmp_path: Path) -> None:
    path = tmp_path / "manifest.json"
    path.write_text("old")

    def half_then_fail(tmp: Path) -> None:
        tmp.write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(path, half_then_fail)
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json"]
    atomic_write(path, lambda tmp: tmp.write_text("new"))
    assert path.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json"]


def test_a_write_reaches_the_disk_before_its_rename_and_the_rename_after(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the first fsync a power cut can leave the renamed file empty; without the second, the old one."""
    events: list[tuple[str, str]] = []
    fsync, replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append(("sync", os.readlink(f"/proc/self/fd/{fd}"))),
                                                 fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append(("replace", str(b))), replace(a, b))[1])
    path = tmp_path / "manifest.json"
    atomic_write(path, lambda tmp: tmp.write_text("new"))
    assert events == [("sync", str(tmp_path / f".manifest.json.{os.getpid()}.tmp")), ("replace", str(path)),
                      ("sync", str(tmp_path))]


def test_current_is_switched_by_one_rename_and_never_absent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server reloading, or `seqrec catalog`, reads ARTIFACTS/current at any moment: an unlink then a new link
    would leave a moment with no `current` at all."""
    v1, v2 = _folder(tmp_path / "v1", "1"), _folder(tmp_path / "v2", "2")
    link = tmp_path / CURRENT
    switch_current(tmp_path, v1)
    assert (link / "manifest.json").read_text() == "1"
    renames: list[tuple[str, str]] = []
    replace = os.replace

    def watched(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        assert (link / "manifest.json").read_text() == "1"  # the old version is served up to the rename itself
        renames.append((Path(src).name, Path(dst).name))
        replace(src, dst)

    unlink = Path.unlink

    def guarded(self: Path, missing_ok: bool = False) -> None:
        assert self != link, "current was unlinked"
        unlink(self, missing_ok)

    monkeypatch.setattr(os, "replace", watched)
    monkeypatch.setattr(Path, "unlink", guarded)
    switch_current(tmp_path, v2)
    assert renames == [(f".{CURRENT}.{os.getpid()}.tmp", CURRENT)]
    assert (link / "manifest.json").read_text() == "2"
    assert os.readlink(link) == "v2"  # relative: the folder can move with its versions
    assert sorted(p.name for p in tmp_path.iterdir()) == [CURRENT, "v1", "v2"]


def _can_exchange(tmp_path: Path) -> bool:
    a, b = _folder(tmp_path / "probe-a", "a"), _folder(tmp_path / "probe-b", "b")
    swapped = atomic._exchange(a, b)
    if swapped:
        assert (a / "manifest.json").read_text() == "b"
        assert (b / "manifest.json").read_text() == "a"
    return swapped


def test_replaces_the_folder_and_leaves_nothing_beside_it(tmp_path: Path) -> None:
    out = _folder(tmp_path / "out", "old")
    (out / "only-in-old").write_text("x")
    staging = _folder(tmp_path / ".out.staging", "new")
    replace_dir(staging, out)
    assert (out / "manifest.json").read_text() == "new"
    assert not (out / "only-in-old").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_new_folder_is_renamed_into_place(tmp_path: Path) -> None:
    staging = _folder(tmp_path / ".out.staging", "new")
    replace_dir(staging, tmp_path / "out")
    assert (tmp_path / "out" / "manifest.json").read_text() == "new"
    assert not staging.exists()


def test_the_folder_is_never_absent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every rename replace_dir makes finds the old or the new folder at ``out`` (the old code moved it aside
    first, so a server reloading the bundle between the two renames found nothing)."""
    if not _can_exchange(tmp_path):
        pytest.skip("this system or file system cannot swap two paths in one step")
    out = _folder(tmp_path / "out", "old")
    staging = _folder(tmp_path / ".out.staging", "new")
    seen: list[bool] = []
    real_replace = os.replace

    def replace(src: object, dst: object) -> None:
        real_replace(src, dst)  # type: ignore[arg-type]
        seen.append(out.is_dir())

    monkeypatch.setattr(atomic.os, "replace", replace)
    replace_dir(staging, out)
    assert all(seen), "a rename left no folder at OUT"
    assert (out / "manifest.json").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("probe-")) == ["out"]


def test_without_exchange_it_falls_back_to_two_renames(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(atomic, "_exchange", lambda a, b: False)
    out = _folder(tmp_path / "out", "old")
    staging = _folder(tmp_path / ".out.staging", "new")
    replace_dir(staging, out)
    assert (out / "manifest.json").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_an_exchange_that_fails_raises_and_keeps_both(tmp_path: Path) -> None:
    if not _can_exchange(tmp_path):
        pytest.skip("this system or file system cannot swap two paths in one step")
    out = _folder(tmp_path / "out", "old")
    with pytest.raises(FileNotFoundError):
        atomic._exchange(tmp_path / "missing", out)
    assert (out / "manifest.json").read_text() == "old"


def test_a_link_is_replaced_by_the_folder_and_its_target_kept(tmp_path: Path) -> None:
    target = _folder(tmp_path / "target", "old")
    out = tmp_path / "out"
    out.symlink_to(target, target_is_directory=True)
    staging = _folder(tmp_path / ".out.staging", "new")
    replace_dir(staging, out)
    assert not out.is_symlink()
    assert (out / "manifest.json").read_text() == "new"
    assert (target / "manifest.json").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "target"]


def test_exclusive_refuses_a_second_holder_and_leaves_nothing_behind(tmp_path: Path) -> None:
    lock = tmp_path / "out" / "run" / "x.lock"
    with exclusive(lock, str):
        assert lock.read_text().startswith(f"pid {os.getpid()}, since 20")
        with pytest.raises(SeqrecError, match=f"^held by pid {os.getpid()}, since 20"), \
                exclusive(lock, lambda holder: f"held by {holder}"):
            pass  # flock is per open file: a second open in this process is refused like another process
        assert lock.exists()  # the refused attempt removed nothing of the holder's
    assert list(tmp_path.iterdir()) == []  # the file and the folders made for it
    kept = tmp_path / "kept"
    kept.mkdir()
    with exclusive(kept / "x.lock", str):
        (kept / "file").write_text("written under the lock")
    assert [p.name for p in kept.iterdir()] == ["file"]
    with exclusive(kept / "x.lock", str):  # taken again once released
        pass
