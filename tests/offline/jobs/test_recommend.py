"""`seqrec recommend`: the precomputed lists are what a real server answers for the same histories; shards
concatenate to the whole; Redis lists are written and expire; bad arguments are one-line errors."""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import redis

from offline.cli import main as seqrec
from tests import needs
from tests.service.support import (
    SHARED_REDIS,
    RedisServer,
    Server,
    free_port,
    prepare_synthetic,
    serving,
    train_bundle,
)

FILTERS = {"year": {"gte": 1990}, "genres": {"ne": "Drama"}}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("batch")
    data = prepare_synthetic(root / "data")
    return data, train_bundle(data, root / "bundle", seed=3)


@pytest.fixture(scope="module")
def server(tiny: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with serving(tmp_path_factory.mktemp("batch-api"), artifacts=str(tiny[1])) as running:
        yield running


def _run(tiny: tuple[Path, Path], out: Path, *extra: str) -> dict[str, Any]:
    data, bundle = tiny
    assert seqrec(["recommend", "--artifact", str(bundle), "--data", str(data), "--out", str(out), "--threads", "1",
                   "-q", *extra]) == 0
    return {u: rows for u, rows in _lists(out).items()}


def _lists(path: Path) -> dict[str, list[tuple[str, float]]]:
    table = pq.read_table(path).to_pylist()
    lists: dict[str, list[tuple[str, float]]] = {}
    for row in table:
        assert row["rank"] == len(lists.setdefault(row["user_id"], [])) + 1
        lists[row["user_id"]].append((row["item_id"], row["score"]))
    return lists


def _histories(data: Path) -> dict[str, list[str]]:
    table = pq.read_table(data / "sequences.parquet")
    return dict(zip(table.column("user_id").to_pylist(), table.column("items").to_pylist(), strict=True))


@pytest.mark.parametrize("extra", [[], ["--stage", "retriever"], ["--filters", json.dumps(FILTERS)]],
                         ids=["two-stage", "retriever", "filtered"])
def test_lists_equal_what_the_server_answers(tiny: tuple[Path, Path], server: Server, tmp_path: Path,
                                             extra: list[str]) -> None:
    lists = _run(tiny, tmp_path / "recs.parquet", "--all", "--k", "10", "--batch-size", "64", *extra)
    histories = _histories(tiny[0])
    assert set(lists) == set(histories)
    body: dict[str, Any] = {"k": 10}
    if "retriever" in extra:
        body["rerank"] = False
    if "--filters" in extra:
        body["filters"] = FILTERS
    with server.client() as client:
        for user, history in histories.items():
            items = client.post("/recommend", json={**body, "history": history}).json()["items"]
            served = [(item["item_id"], item["score"]) for item in items]
            assert [i for i, _ in lists[user]] == [i for i, _ in served], user
            assert [s for _, s in lists[user]] == pytest.approx([s for _, s in served], rel=1e-5, abs=1e-6)


def test_shards_concatenate_to_the_whole(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    whole = _run(tiny, tmp_path / "all.parquet", "--all", "--k", "5")
    parts = [_run(tiny, tmp_path / f"part{i}.parquet", "--all", "--k", "5", "--shard", f"{i}/3") for i in range(3)]
    assert sum(len(p) for p in parts) == len(whole)
    assert all(parts)  # every shard got some of the 150 users
    merged = {u: rows for p in parts for u, rows in p.items()}
    assert merged.keys() == whole.keys()
    for user, rows in whole.items():
        assert [i for i, _ in merged[user]] == [i for i, _ in rows]
        assert [s for _, s in merged[user]] == pytest.approx([s for _, s in rows], rel=1e-5, abs=1e-6)


def test_users_file_picks_users_in_its_order(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    users = list(_histories(tiny[0]))[5:9][::-1]
    # as a spreadsheet exports it: a byte-order mark, CRLF line ends, a blank line
    (tmp_path / "users.txt").write_text("\ufeff" + "\r\n".join([*users, "", users[0]]) + "\r\n", newline="")
    out = tmp_path / "some.parquet"
    _run(tiny, out, "--users", str(tmp_path / "users.txt"), "--k", "3")
    assert list(dict.fromkeys(pq.read_table(out).column("user_id").to_pylist())) == users


def test_item_files_restrict_and_exclude(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    whole = _run(tiny, tmp_path / "all.parquet", "--all", "--k", "5")
    shown = sorted({item for rows in whole.values() for item, _ in rows})
    deny, allow = shown[: len(shown) // 2], shown[len(shown) // 2:]
    (tmp_path / "deny.txt").write_text("\ufeff" + "\n".join(deny) + "\n")  # with a byte-order mark
    (tmp_path / "allow.txt").write_text("\n".join(allow) + "\n")
    denied = _run(tiny, tmp_path / "deny.parquet", "--all", "--k", "5", "--exclude-items", str(tmp_path / "deny.txt"))
    assert denied.keys() == whole.keys()
    assert not {item for rows in denied.values() for item, _ in rows} & set(deny)
    allowed = _run(tiny, tmp_path / "allow.parquet", "--all", "--k", "5", "--include-items",
                   str(tmp_path / "allow.txt"))
    assert {item for rows in allowed.values() for item, _ in rows} <= set(allow)
    assert any(len(rows) == 5 for rows in allowed.values())


def test_redis_lists_are_written_and_expire(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    needs.shared_redis()
    prefix = f"seqrec-test:{uuid.uuid4().hex}:"
    lists = _run(tiny, tmp_path / "recs.parquet", "--all", "--k", "4", "--redis-url", SHARED_REDIS,
                 "--redis-prefix", prefix, "--ttl", "2")
    with redis.Redis.from_url(SHARED_REDIS) as client:
        try:
            for user, rows in lists.items():
                stored = json.loads(client.get(f"{prefix}recs:{user}"))
                assert [(i["item_id"], i["score"]) for i in stored["items"]] == rows
                assert 0 < client.pttl(f"{prefix}recs:{user}") <= 2000
            time.sleep(2.2)
            assert not list(client.scan_iter(match=f"{prefix}*", count=1000))
        finally:
            keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
            if keys:
                client.delete(*keys)


def test_a_redis_that_refuses_writes_is_a_one_line_error(tiny: tuple[Path, Path], tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """A Redis that answers PING but refuses the lists (full: maxmemory reached under noeviction) is the
    user's to fix: one line naming it, exit 1, no Parquet file (it was an internal error with a traceback hint)."""
    needs.program("redis-server")
    full = RedisServer(free_port())
    full.start()
    try:
        with redis.Redis.from_url(full.url) as client:
            client.config_set("maxmemory-policy", "noeviction")
            client.config_set("maxmemory", "1")
        data, bundle = tiny
        out = tmp_path / "recs.parquet"
        assert seqrec(["recommend", "--artifact", str(bundle), "--data", str(data), "--out", str(out), "--all",
                       "--redis-url", full.url, "-q"]) == 1
    finally:
        full.kill()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    expected = f"seqrec: error: --redis-url {full.url}: Redis refused the lists: OutOfMemoryError: command not allowed"
    assert err[0].startswith(expected), err[0]
    assert err[0].endswith(f"(earlier batches stored the lists of 0 users; {out} was not written)"), err[0]
    assert not out.exists()
    assert not list(tmp_path.glob(".recs.parquet.*"))


@pytest.mark.parametrize(("args", "message"), [
    (["--all", "--shard", "3/3"], "--shard 3/3"),
    (["--all", "--shard", "x"], "--shard must look like I/N"),
    (["--all", "--k", "0"], "--k must be >= 1"),
    (["--all", "--ttl", "5"], "--ttl needs --redis-url"),
    (["--all", "--filters", "{year"], "--filters is not valid JSON"),
    (["--all", "--filters", '{"colour": "red"}'], "--filters: filters.colour: Extra inputs are not permitted"),
    (["--all", "--filters", '{"year": {"near": 1}}'], "filters.year.near"),
    (["--all", "--filters", '{"year": {"gte": "x"}}'], "filters.year.gte"),
    (["--users", "USERS"], "are not in"),
    (["--all", "--redis-url", "redis://127.0.0.1:1/0"], "cannot reach Redis"),
    (["--all", "--redis-url", "redis://:s3cret@127.0.0.1:1/0"], "--redis-url redis://:***@127.0.0.1:1/0: cannot reach"),
])
def test_bad_arguments_are_one_line_errors(tiny: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           args: list[str], message: str) -> None:
    (tmp_path / "users.txt").write_text("no-such-user\n")
    args = [str(tmp_path / "users.txt") if a == "USERS" else a for a in args]
    data, bundle = tiny
    out = tmp_path / "recs.parquet"
    assert seqrec(["recommend", "--artifact", str(bundle), "--data", str(data), "--out", str(out), *args]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("seqrec: error:")
    assert message in err[0]
    assert "s3cret" not in err[0]  # a Redis password never reaches the terminal
    assert not out.exists()
    assert not list(tmp_path.glob(".recs.parquet.*"))  # no temporary file left behind


def test_an_output_that_is_a_folder_is_one_line_naming_it(tiny: tuple[Path, Path], tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    data, bundle = tiny
    folder = tmp_path / "lists"
    folder.mkdir()
    (folder / "kept.txt").write_text("a file already there\n")
    assert seqrec(["recommend", "--artifact", str(bundle), "--data", str(data), "--out", str(folder), "--all"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"seqrec: error: {folder}: a folder; --out names the Parquet file to write "
                   f"(e.g. {folder / 'recs.parquet'})"]
    assert sorted(p.name for p in folder.iterdir()) == ["kept.txt"]
    assert not list(tmp_path.glob(".lists.*"))  # no temporary file left behind


def test_lists_leave_out_what_the_served_catalogue_retired(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    """The job loaded the bundle without its catalogue journal: a retired item stayed in 573 of a helper's lists,
    and lists near it came out in another order than POST /recommend answers."""
    import shutil

    from service.system.catalog import CatalogChanges, write_journal

    data, bundle = tiny
    before = _run(tiny, tmp_path / "before.parquet", "--all", "--k", "10")
    top = Counter(item for rows in before.values() for item, _ in rows).most_common(1)[0][0]
    retired = tmp_path / "bundle"
    shutil.copytree(bundle, retired)
    write_journal(retired, CatalogChanges(retired=[top]))
    after = _run((data, retired), tmp_path / "after.parquet", "--all", "--k", "10")
    assert all(top not in [item for item, _ in rows] for rows in after.values())
    assert all(len(rows) == 10 for rows in after.values())


def test_an_out_or_a_redis_database_it_cannot_use_is_refused_before_any_list(tiny: tuple[Path, Path], tmp_path: Path,
                                                                            capsys: pytest.CaptureFixture) -> None:
    data, bundle = tiny
    job = ["recommend", "--artifact", str(bundle), "--data", str(data), "--all", "--threads", "1", "-q"]
    assert seqrec([*job, "--out", "/proc/recs.parquet"]) == 1  # an internal error once every list was computed
    assert capsys.readouterr().err.strip().startswith("seqrec: error: --out /proc/recs.parquet: cannot write into "
                                                      "/proc: ")
    assert seqrec([*job, "--out", str(tmp_path / "r.parquet"), "--redis-url", "redis://127.0.0.1:6379/abc"]) == 1
    assert capsys.readouterr().err.strip() == (  # it wrote into database 0 and exited 0
        "seqrec: error: --redis-url redis://127.0.0.1:6379/abc: the database 'abc' is not a number")
    assert not (tmp_path / "r.parquet").exists()


def test_an_out_inside_a_dataset_or_a_bundle_is_refused(tiny: tuple[Path, Path], tmp_path: Path,
                                                        capsys: pytest.CaptureFixture) -> None:
    """The lists replaced the dataset's sequences.parquet (its checksum then failed) or the bundle's
    catalogue.parquet (the service could no longer load it), exit 0."""
    import shutil

    data, bundle = tiny
    data_copy, bundle_copy = tmp_path / "data", tmp_path / "bundle"
    shutil.copytree(data, data_copy)
    shutil.copytree(bundle, bundle_copy)
    before = {path: path.read_bytes() for folder in (data_copy, bundle_copy) for path in folder.rglob("*")
              if path.is_file()}
    job = ["recommend", "--artifact", str(bundle), "--data", str(data), "--all", "--k", "3", "-q"]
    dataset, artifact = "a prepared dataset written by `seqrec prepare`", \
        "a retriever artifact or bundle written by `seqrec train` or `seqrec pipeline`"
    for folder, out, kind in ((data_copy, data_copy / "sequences.parquet", dataset),
                              (bundle_copy, bundle_copy / "catalogue.parquet", artifact),
                              (data_copy, data_copy / "lists" / "recs.parquet", dataset)):
        assert seqrec([*job, "--out", str(out)]) == 1
        assert capsys.readouterr().err.strip().splitlines() == [
            f"seqrec: error: --out {out} is inside {folder.resolve()}, {kind}; write the lists outside it"]
    after = {path: path.read_bytes() for folder in (data_copy, bundle_copy) for path in folder.rglob("*")
             if path.is_file()}
    assert after == before
    assert not (data_copy / "lists").exists()


def test_a_bundle_of_another_catalogue_is_refused(tiny: tuple[Path, Path], tmp_path: Path,
                                                  capsys: pytest.CaptureFixture) -> None:
    """No history item was known, every user got the same popularity list, exit 0."""
    _, bundle = tiny
    log, other, out = tmp_path / "log.csv", tmp_path / "other", tmp_path / "recs.parquet"
    log.write_text("user_id,item_id,timestamp\n" + "".join(f"u{u},x{(u + t) % 9},{t}\n" for u in range(20)
                                                           for t in range(5)))
    assert seqrec(["prepare", "--dataset", "csv", "--path", str(log), "--out", str(other), "-q"]) == 0
    capsys.readouterr()
    assert seqrec(["recommend", "--artifact", str(bundle), "--data", str(other), "--all", "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"seqrec: error: {other} shares no item id with the bundle's catalogue (e.g. 'x0' is not in it): "
                   "a bundle of another catalogue"]
    assert not out.exists()


def test_data_with_items_the_bundle_does_not_know_is_answered_with_a_warning(
        tiny: tuple[Path, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Data prepared after training holds new items (nightly lists): they are dropped from the histories, as the
    service drops them, and said so; every user is answered."""
    _, bundle = tiny
    other, out = tmp_path / "other", tmp_path / "recs.parquet"
    assert seqrec(["prepare", "--dataset", "synthetic", "--n-users", "150", "--n-items", "60", "--mean-length", "12",
                   "--seed", "12", "--out", str(other), "-q"]) == 0
    with caplog.at_level(logging.WARNING):
        assert seqrec(["recommend", "--artifact", str(bundle), "--data", str(other), "--all", "--out", str(out)]) == 0
    assert any("3 of" in r.message and "not in the bundle's catalogue (e.g. 'i34')" in r.message
               for r in caplog.records), [r.message for r in caplog.records]
    assert len(_lists(out)) == 150


def test_a_missing_artifact_names_the_flag_recommend_takes(tiny: tuple[Path, Path], tmp_path: Path,
                                                           capsys: pytest.CaptureFixture) -> None:
    data, _ = tiny
    missing = tmp_path / "nope"
    assert seqrec(["recommend", "--artifact", str(missing), "--data", str(data), "--all",
                   "--out", str(tmp_path / "r.parquet")]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [f"seqrec: error: --artifact {missing}: no such folder"]
