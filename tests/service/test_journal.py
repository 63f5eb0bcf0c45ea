"""The catalogue journal's file (`service.system.journal`): appended, read from where a reader stopped, a torn last
line (a kill -9 mid-write) skipped and cut by the next change, the previous format loaded and carried over; and a
real server killed with SIGKILL in the middle of a stream of changes keeps exactly the acknowledged ones."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from offline.bench.faults.journal import kill_during_changes
from service.system.catalog import LEGACY_JOURNAL, CatalogChanges, read_journal
from service.system.journal import JOURNAL, append_record, journal_file, journal_home, read_records, read_since


def test_appends_are_read_whole_or_from_where_a_reader_stopped(tmp_path: Path) -> None:
    append_record(tmp_path, {"added": [{"item_id": "a"}]})
    records, position = read_records(tmp_path)
    assert records == [{"added": [{"item_id": "a"}]}]
    assert position is not None
    append_record(tmp_path, {"retired": ["a"]})
    assert read_since(tmp_path, position) == ([{"retired": ["a"]}], (position[0], (tmp_path / JOURNAL).stat().st_size))
    lines = (tmp_path / JOURNAL).read_text().splitlines()
    assert json.loads(lines[0]) == {"format": "seqrec.catalogue-changes/2"}
    assert len(lines) == 3


def test_a_torn_last_line_is_skipped_then_cut_by_the_next_change(tmp_path: Path) -> None:
    append_record(tmp_path, {"retired": ["a"]})
    with (tmp_path / JOURNAL).open("ab") as handle:
        handle.write(b'{"retired":["b"')  # a write cut short by kill -9: never acknowledged
    assert read_journal(tmp_path).retired == ["a"]
    append_record(tmp_path, {"retired": ["c"]})
    assert read_journal(tmp_path).retired == ["a", "c"]
    assert (tmp_path / JOURNAL).read_text().endswith('{"retired":["c"]}\n')


def test_the_previous_format_loads_and_the_first_change_carries_it_over(tmp_path: Path) -> None:
    (tmp_path / LEGACY_JOURNAL).write_text(json.dumps({"format": "seqrec.catalogue-changes/1",
                                                       "added": [{"item_id": "x"}], "retired": ["i1"]}))
    assert (read_journal(tmp_path).added_ids, read_journal(tmp_path).retired) == (["x"], ["i1"])
    append_record(tmp_path, {"retired": ["i2"]})
    changes = read_journal(tmp_path)
    assert (changes.added_ids, changes.retired) == (["x"], ["i1", "i2"])
    (tmp_path / LEGACY_JOURNAL).unlink()  # the new file holds everything now
    assert read_journal(tmp_path).retired == ["i1", "i2"]


def test_a_published_version_reads_the_journal_beside_the_versions(tmp_path: Path) -> None:
    version = tmp_path / "versions" / "v1"
    version.mkdir(parents=True)
    assert journal_home(version) == tmp_path.resolve()
    assert journal_file(version) == tmp_path.resolve() / JOURNAL
    assert journal_home(tmp_path / "elsewhere") == (tmp_path / "elsewhere").resolve()


def test_changes_count_each_id_once(tmp_path: Path) -> None:
    changes = CatalogChanges()
    changes.extend([{"retired": ["a"]}, {"retired": ["a", "b"]}, {"added": [{"item_id": "n"}]}], None)
    assert changes.retired == ["a", "b"]
    assert changes.is_retired("a")
    assert changes.is_added("n")
    assert not changes.is_added("a")


def test_a_server_killed_mid_change_keeps_exactly_what_it_acknowledged(bundle: Path, tmp_path: Path) -> None:
    report = kill_during_changes(Path(shutil.copytree(bundle, tmp_path / "b")), tmp_path, seed=1, kill_after_s=2.0)
    assert report["acknowledged"] > 0
    assert report["lost"] == []
    assert set(report["unacknowledged_kept"]) <= {i for _, i in report["in_flight"]}
    assert report["ok"]


@pytest.mark.parametrize("size", [10])
def test_the_bench_times_both_kinds_of_change(bundle: Path, tmp_path: Path, size: int) -> None:
    from offline.bench.faults.journal import timed_changes

    row = timed_changes(bundle, tmp_path, size, changes=3)
    assert row["pending_items"] == size
    assert row["add_ms"]["n"] == row["retire_ms"]["n"] == 3
