import dataclasses
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from common.errors import SeqrecError
from offline.data.errors import DataError
from offline.data.prepare import MAX_ID_CHARS, Filters, prepare
from offline.data.prepared import load_prepared
from offline.data.readers.tabular import read_tabular
from offline.data.split import repeat_shares

# Rows out of time order, with ties inside users u1 and u2. On a tie the file order
# must win: u1's items at t=10 come as c, a (never sorted by id to a, c).
LOG = """user,item,ts
u2,x,5
u1,c,10
u1,b,3
u1,a,10
u2,y,5
u2,z,1
u1,d,20
u3,a,1
u3,b,2
"""


def _prepare(write, tmp_path, text=LOG, filters=None, **kwargs):
    raw = read_tabular(write("log.csv", text), user_col="user", item_col="item", time_col="ts")
    return prepare(raw, tmp_path / "prepared", filters, **kwargs)


def test_stable_sort_keeps_file_order_on_ties(write, tmp_path):
    _prepare(write, tmp_path)
    seqs = pq.read_table(tmp_path / "prepared" / "sequences.parquet").to_pylist()
    by_user = {row["user_id"]: row["items"] for row in seqs}
    # u3 has 2 interactions and is dropped by the default minimum of 3.
    assert by_user == {"u1": ["b", "c", "a", "d"], "u2": ["z", "x", "y"]}
    times = {row["user_id"]: row["timestamps"] for row in seqs}
    assert times["u1"] == [3, 10, 10, 20]


def test_default_filter_drops_users_below_three_and_manifest_counts(write, tmp_path):
    manifest = _prepare(write, tmp_path)
    assert (manifest["users"], manifest["items"], manifest["interactions"]) == (2, 7, 7)
    assert manifest["filters"] == {"min_user_interactions": 3, "k_core": None, "min_rating": None}
    on_disk = json.loads((tmp_path / "prepared" / "manifest.json").read_text())
    assert set(on_disk["sha256"]) == {"sequences.parquet", "items.parquet"}
    assert on_disk["source"] == "csv"
    assert on_disk["source_files"].keys() == {"log.csv"}


def test_internal_ids_are_contiguous_with_zero_for_padding(write, tmp_path):
    _prepare(write, tmp_path)
    data = load_prepared(tmp_path / "prepared")
    assert list(data.item_ids) == ["", "a", "b", "c", "d", "x", "y", "z"]
    assert data.n_items == 7
    assert data.sequences.to_lists() == [[2, 3, 1, 4], [7, 5, 6]]
    assert list(data.user_ids) == ["u1", "u2"]
    assert data.sequences.timestamps.tolist() == [3, 10, 10, 20, 1, 5, 5]


def test_numeric_ids_sort_numerically(write, tmp_path):
    text = "user,item,ts\n10,2,1\n10,10,2\n10,1,3\n9,2,1\n9,1,2\n9,3,3\n"
    _prepare(write, tmp_path, text)
    data = load_prepared(tmp_path / "prepared")
    assert list(data.item_ids) == ["", "1", "2", "3", "10"]
    assert list(data.user_ids) == ["9", "10"]


def test_ids_that_int_cannot_read_sort_as_text_or_by_their_digits(write, tmp_path):
    """'²' (a digit to str.isdigit) and an id of 5,000 digits were internal errors in int(); ids over 256 characters
    are refused now (`test_ids_longer_than_a_request_may_carry_are_refused`), so the longest that sorts is 256."""
    long = "9" * MAX_ID_CHARS
    text = "user,item,ts\n" + "".join(f"{u},{i},{t}\n" for u in ("u1", long, "7", "007")
                                      for t, i in enumerate(("²", "10", "2", "a")))
    _prepare(write, tmp_path, text)
    data = load_prepared(tmp_path / "prepared")
    assert list(data.item_ids) == ["", "2", "10", "a", "²"]
    assert list(data.user_ids) == ["007", "7", long, "u1"]  # numbers by value ("007" and "7" two ids), then text


def test_k_core_is_iterative(write, tmp_path):
    # k = 3: item "rare" occurs once and goes; that leaves u3 with 2 interactions, so u3
    # goes in the next round, which leaves item "d" (u3, u4, u5) with 2, below 3, so "d"
    # goes and u4, u5 fall to 2 interactions and go too.
    users = {"u1": "abc", "u2": "abc", "u6": "abc", "u3": ["d", "c", "rare"], "u4": "dab", "u5": "dab"}
    text = "user,item,ts\n" + "".join(f"{u},{i},{t}\n" for u, items in users.items() for t, i in enumerate(items))
    manifest = _prepare(write, tmp_path, text, Filters(min_user_interactions=3, k_core=3))
    data = load_prepared(tmp_path / "prepared")
    assert list(data.item_ids) == ["", "a", "b", "c"]
    assert list(data.user_ids) == ["u1", "u2", "u6"]
    assert manifest["interactions"] == 9


def test_tampered_file_is_refused(write, tmp_path):
    _prepare(write, tmp_path)
    items = tmp_path / "prepared" / "items.parquet"
    items.write_bytes(items.read_bytes() + b"x")
    with pytest.raises(DataError, match="checksum"):
        load_prepared(tmp_path / "prepared")


def test_existing_output_needs_overwrite_and_is_replaced_whole(write, tmp_path):
    _prepare(write, tmp_path)
    with pytest.raises(SeqrecError, match="--overwrite"):
        _prepare(write, tmp_path)
    (tmp_path / "prepared" / "sequences.parquet").write_bytes(b"stale")
    _prepare(write, tmp_path, overwrite=True)
    assert load_prepared(tmp_path / "prepared").n_users == 2  # the stale file replaced, its checksum agrees
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_overwrite_refuses_a_dataset_that_holds_what_prepare_did_not_write(write, tmp_path):
    """A model trained into the dataset's folder (`seqrec train --out DATA/model`) was deleted without a word."""
    _prepare(write, tmp_path)
    model = tmp_path / "prepared" / "model"
    model.mkdir()
    (model / "retriever.pt").write_bytes(b"weights")
    (tmp_path / "prepared" / "notes.txt").write_text("mine")
    with pytest.raises(SeqrecError) as refused:
        _prepare(write, tmp_path, overwrite=True)
    assert str(refused.value) == (f"{tmp_path / 'prepared'}: holds {model} (and 1 more), which a prepared dataset "
                                  "does not write, and the output replaces the folder as a whole; move it out first, "
                                  "or choose a new folder")
    assert (model / "retriever.pt").read_bytes() == b"weights"


def test_overwrite_replaces_only_a_prepared_dataset(write, tmp_path):
    # --overwrite replaces the folder as a whole: a typo naming some other folder must not delete it
    other = tmp_path / "prepared"
    other.mkdir()
    (other / "notes.txt").write_text("someone's files")
    with pytest.raises(SeqrecError, match="holds files that are not a prepared dataset"):
        _prepare(write, tmp_path, overwrite=True)
    assert (other / "notes.txt").read_text() == "someone's files"
    other.rename(tmp_path / "moved")
    (tmp_path / "prepared").write_text("a file")
    with pytest.raises(SeqrecError, match="a file, where a prepared dataset is to be written"):
        _prepare(write, tmp_path, overwrite=True)
    (tmp_path / "prepared").unlink()
    (tmp_path / "prepared").mkdir()  # an empty folder is taken
    _prepare(write, tmp_path, overwrite=True)


def test_min_user_interactions_below_three_is_refused():
    with pytest.raises(SeqrecError, match=">= 3"):
        Filters(min_user_interactions=2)


def test_metadata_is_joined_in_item_order(write, tmp_path):
    items = write("items.csv", 'item,title,genres\nz,"Zed, the film",Drama|War\na,Alpha,Comedy\n')
    raw = read_tabular(write("log.csv", LOG), user_col="user", item_col="item", time_col="ts", items_path=items)
    prepare(raw, tmp_path / "p")
    rows = pq.read_table(tmp_path / "p" / "items.parquet").to_pylist()
    assert rows[0] == {"item_idx": 1, "item_id": "a", "title": "Alpha", "genres": ["Comedy"]}
    assert rows[-1] == {"item_idx": 7, "item_id": "z", "title": "Zed, the film", "genres": ["Drama", "War"]}
    assert rows[1]["title"] is None  # b has no metadata


def test_items_the_metadata_lacks_are_reported(write, tmp_path, caplog):
    """Their columns stay empty, as they did, but no longer without a word."""
    items = write("items.csv", 'item,title,genres\nz,"Zed, the film",Drama|War\na,Alpha,Comedy\n')
    raw = read_tabular(write("log.csv", LOG), user_col="user", item_col="item", time_col="ts", items_path=items)
    prepare(raw, tmp_path / "p")
    n_items = pq.read_table(tmp_path / "p" / "items.parquet").num_rows
    assert (f"metadata has no row for {n_items - 2} of {n_items} items (e.g. 'b'); their metadata columns are empty"
            in caplog.text)


def test_duplicate_metadata_ids_are_refused(write, tmp_path):
    # The readers refuse a duplicate with its file and lines (test_malformed.py); prepare() keeps
    # its own guard for datasets built in code.
    raw = read_tabular(write("log.csv", LOG), user_col="user", item_col="item", time_col="ts")
    raw = dataclasses.replace(raw, items=pa.table({"item_id": ["a", "b", "a"], "title": ["Alpha", "Beta", "Again"]}))
    with pytest.raises(SeqrecError, match="item_id 'a' more than once"):
        prepare(raw, tmp_path / "p")
    assert not (tmp_path / "p").exists()


def test_the_manifest_stores_the_share_of_repeat_targets(write, tmp_path):
    # u1: a b a c a -> valid target c (fresh), test target a (a repeat); u2: x y x y -> both repeats;
    # u3: p q r s -> neither.
    log = "user,item,ts\n" + "".join(f"{u},{i},{t}\n" for u, seq in (("u1", "abaca"), ("u2", "xyxy"), ("u3", "pqrs"))
                                    for t, i in enumerate(seq))
    manifest = _prepare(write, tmp_path, text=log)
    assert manifest["repeat_targets"] == {"valid": round(1 / 3, 6), "test": round(2 / 3, 6)}
    data = load_prepared(tmp_path / "prepared")
    assert data.repeat_shares == manifest["repeat_targets"]
    assert repeat_shares(data.split()) == manifest["repeat_targets"]  # what an older folder gets computed


@pytest.mark.parametrize("column", ["user", "item"])
def test_ids_longer_than_a_request_may_carry_are_refused(write, tmp_path, column):
    """An item id of 257 characters was trained on and evaluated, yet every request naming it was a 422."""
    long = "L" * (MAX_ID_CHARS + 1)
    text = LOG.replace("u1," if column == "user" else ",a,", f"{long}," if column == "user" else f",{long},")
    with pytest.raises(SeqrecError, match=rf"1 {column} id\(s\) longer than 256 characters.*\(257 characters\)"):
        _prepare(write, tmp_path, text)
    assert not (tmp_path / "prepared").exists()
    fits = LOG.replace(",a,", f",{'L' * MAX_ID_CHARS},")
    assert _prepare(write, tmp_path, fits)["items"] == 7


def test_the_id_limit_is_the_services():
    from service.http.schemas import RecommendRequest

    schema = RecommendRequest.model_json_schema()
    history = schema["properties"]["history"]["anyOf"][0]["items"]["anyOf"][0]
    assert history["maxLength"] == MAX_ID_CHARS
