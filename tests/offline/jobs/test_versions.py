"""offline.jobs.versions.prune_versions: which published versions `seqrec pipeline --keep N` deletes, on
hand-made bundles (a manifest listing one file, and the pipeline's publish record)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from offline.jobs.versions import CURRENT, STALE_AFTER, VERSIONS, prune_versions, switch_current

NOW = time.time()


def _bundle(artifacts: Path, minute: int) -> Path:
    """versions/<id> created and published at 12:<minute>, its folder dated <minute> hours ago."""
    path = artifacts / VERSIONS / f"20240101T12{minute:02d}00Z-transformer-{minute:08x}"
    path.mkdir(parents=True)
    (path / "retriever.pt").write_bytes(b"weights")
    stamp = f"2024-01-01T12:{minute:02d}:00+00:00"
    (path / "manifest.json").write_text(json.dumps({"version": path.name, "created_at": stamp,
                                                    "sha256": {"retriever.pt": "0" * 64}}))
    (path / "pipeline.json").write_text(json.dumps({"published_at": stamp}))
    _date(path, NOW - 3600 * (60 - minute))
    return path


def _date(path: Path, when: float) -> None:
    for root, _, files in os.walk(path):
        for name in files:
            os.utime(os.path.join(root, name), (when, when))
    os.utime(path, (when, when))


def _names(artifacts: Path) -> list[str]:
    return sorted(p.name for p in (artifacts / VERSIONS).iterdir())


def test_the_newest_by_publish_time_stay_not_by_folder_date(tmp_path: Path) -> None:
    """`seqrec export` on the oldest version swaps its folder, dating it now: the previous version (the rollback
    target) was deleted instead of it."""
    v1, v2, v3, v4 = (_bundle(tmp_path, minute) for minute in (1, 2, 3, 4))
    _date(v1, NOW)  # exported just now
    switch_current(tmp_path, v4)
    assert prune_versions(tmp_path, 3) == [v1]
    assert _names(tmp_path) == [v2.name, v3.name, v4.name]


def test_the_version_id_orders_bundles_without_a_publish_record(tmp_path: Path) -> None:
    v1, v2 = _bundle(tmp_path, 1), _bundle(tmp_path, 2)
    for bundle in (v1, v2):  # copied in by hand: no pipeline.json; same creation second
        (bundle / "pipeline.json").unlink()
        manifest = json.loads((bundle / "manifest.json").read_text())
        (bundle / "manifest.json").write_text(json.dumps({**manifest, "created_at": "2024-01-01T12:00:00+00:00"}))
    _date(v2, NOW - 3600)
    _date(v1, NOW)
    switch_current(tmp_path, v2)
    assert prune_versions(tmp_path, 1) == [v1]


def test_of_two_versions_published_in_one_second_current_is_the_newer(tmp_path: Path) -> None:
    """Publish times have whole seconds: the version id's hash broke the tie, so keep 1 could keep the other
    version, and `current` beside it (tests/offline/jobs/test_pipeline.py's pruning test failed so by chance)."""
    older, newer = _bundle(tmp_path, 9), _bundle(tmp_path, 1)  # newer's id sorts first
    record = json.dumps({"published_at": "2024-01-01T12:00:00+00:00"})
    for bundle in (older, newer):
        (bundle / "pipeline.json").write_text(record)
    switch_current(tmp_path, newer)
    assert prune_versions(tmp_path, 1) == [older]
    assert _names(tmp_path) == [newer.name]


def test_current_is_never_deleted(tmp_path: Path) -> None:
    v1, v2, v3 = (_bundle(tmp_path, minute) for minute in (1, 2, 3))
    switch_current(tmp_path, v1)  # rolled back by hand
    assert prune_versions(tmp_path, 1) == [v2]
    assert _names(tmp_path) == [v1.name, v3.name]
    assert (tmp_path / CURRENT).resolve() == v1.resolve()


def test_temp_folders_and_half_deleted_versions_are_not_versions(tmp_path: Path) -> None:
    """A killed `seqrec export` leaves its staging copy `.<version>.XXXXXXXX`: it counted as one of the `keep`,
    so a real version went in its place, and it stayed forever. It is deleted once untouched for STALE_AFTER
    seconds, never while a writer may still fill it; so is a version half deleted by a killed prune."""
    v1, v2, v3 = (_bundle(tmp_path, minute) for minute in (1, 2, 3))
    switch_current(tmp_path, v3)
    versions = tmp_path / VERSIONS
    writing = versions / f".{v3.name}.k2x9q0ab"  # an export running now
    writing.mkdir()
    (writing / "retriever.pt").write_bytes(b"weights")
    killed = versions / f".{v1.name}.old.a0b1c2d3"  # a swap killed long ago
    killed.mkdir()
    _date(killed, time.time() - STALE_AFTER - 60)
    half = _bundle(tmp_path, 0)  # its manifest still there, its weights gone
    (half / "retriever.pt").unlink()  # just now: the folder is dated now
    assert prune_versions(tmp_path, 3) == []
    assert _names(tmp_path) == sorted([writing.name, half.name, v1.name, v2.name, v3.name])
    _date(writing, time.time() - STALE_AFTER + 600)  # untouched for a while, not yet long enough
    _date(half, time.time() - STALE_AFTER - 60)
    assert prune_versions(tmp_path, 3) == []
    assert _names(tmp_path) == sorted([writing.name, v1.name, v2.name, v3.name])


def test_a_deleted_versions_mining_cache_goes_with_it_and_a_killed_prune_is_finished(tmp_path: Path) -> None:
    v1, v2, v3 = (_bundle(tmp_path, minute) for minute in (1, 2, 3))
    for bundle in (v1, v2, v3):
        (tmp_path / VERSIONS / f"{bundle.name}.mining").mkdir()
    switch_current(tmp_path, v3)
    trash = tmp_path / VERSIONS / f".{_bundle(tmp_path, 0).name}.pruned"  # a prune killed after its rename
    os.replace(trash.with_name(trash.name[1:-len(".pruned")]), trash)
    assert prune_versions(tmp_path, 2) == [v1]
    assert _names(tmp_path) == sorted([v2.name, f"{v2.name}.mining", v3.name, f"{v3.name}.mining"])
