from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from offline.data.errors import DataError
from offline.data.readers.recbole import read_recbole

SHARED_DATA = Path(__file__).resolve().parents[3].parent / "shared" / "data"
needs_shared_data = pytest.mark.skipif(not SHARED_DATA.is_dir(), reason=f"real data copies not found at {SHARED_DATA}")

INTER = "user_id:token\titem_id:token\trating:float\ttimestamp:float\nu2\ti9\t4\t300\nu1\ti9\t5\t100\nu2\ti7\t3\t200\n"


def write(path: Path, text: str | bytes) -> Path:
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    return path


def test_inter_item_and_user_files(tmp_path: Path) -> None:
    write(tmp_path / "toy.inter", INTER)
    write(
        tmp_path / "toy.item",
        "item_id:token\tmovie_title:token_seq\trelease_year:token\tclass:token_seq\ttags:token_seq\t"
        "price:float\tvec:float_seq\tbrand:token\n"
        "i9\tCafé Society\t1995\tDrama Romance\tcozy  old\t9.5\t0.5 1\tAcme\n"
        "i7\tunkonwn\tunkonwn\t\t\t\t\t\n",
    )
    write(tmp_path / "toy.user", "user_id:token\tage:token\tgender:token\nu1\t24\tM\nu2\t53\tF\n")
    data = read_recbole(tmp_path)
    assert data.source == "recbole"
    assert data.has_timestamps
    assert data.interactions.schema == pa.schema(
        [("user_id", pa.string()), ("item_id", pa.string()), ("timestamp", pa.int64()), ("rating", pa.float64())]
    )
    assert data.interactions.to_pydict() == {
        "user_id": ["u2", "u1", "u2"],
        "item_id": ["i9", "i9", "i7"],
        "timestamp": [300, 100, 200],
        "rating": [4.0, 5.0, 3.0],
    }
    assert data.items is not None
    assert data.items.schema == pa.schema(
        [
            ("item_id", pa.string()),
            ("title", pa.string()),
            ("year", pa.int32()),
            ("genres", pa.list_(pa.string())),
            ("tags", pa.list_(pa.string())),
            ("price", pa.float64()),
            ("vec", pa.list_(pa.float64())),
            ("brand", pa.string()),
        ]
    )
    assert data.items.to_pydict() == {
        "item_id": ["i9", "i7"],
        "title": ["Café Society", "unkonwn"],
        "year": [1995, None],
        "genres": [["Drama", "Romance"], []],
        "tags": [["cozy", "old"], []],
        "price": [9.5, None],
        "vec": [[0.5, 1.0], []],
        "brand": ["Acme", ""],
    }
    assert data.users is not None
    assert data.users.to_pydict() == {"user_id": ["u1", "u2"], "age": ["24", "53"], "gender": ["M", "F"]}
    assert data.files == [tmp_path / "toy.inter", tmp_path / "toy.item", tmp_path / "toy.user"]


def test_fractional_timestamps_stay_float(tmp_path: Path) -> None:
    write(tmp_path / "x.inter", "user_id:token\titem_id:token\ttimestamp:float\na\tb\t1.5\na\tc\t2\n")
    data = read_recbole(tmp_path)
    assert data.interactions.schema.field("timestamp").type == pa.float64()
    assert data.interactions["timestamp"].to_pylist() == [1.5, 2.0]
    assert data.interactions.column_names == ["user_id", "item_id", "timestamp"]
    assert data.items is None
    assert data.users is None


@pytest.mark.parametrize("suffix", ["", ".0"])
def test_large_whole_timestamps_are_read_exactly(tmp_path: Path, suffix: str) -> None:
    # Through float64 all three were 1600000000000000000: a tie, so the stable sort kept 10, 20, 30.
    rows = "".join(f"1\t{item}\t160000000000000000{digit}{suffix}\n" for item, digit in ((10, 3), (20, 1), (30, 2)))
    write(tmp_path / "x.inter", "user_id:token\titem_id:token\ttimestamp:float\n" + rows)
    data = read_recbole(tmp_path)
    assert data.interactions.schema.field("timestamp").type == pa.int64()
    assert data.interactions["timestamp"].to_pylist() == [1600000000000000003, 1600000000000000001, 1600000000000000002]


def test_no_timestamp_field_gives_file_positions(tmp_path: Path) -> None:
    write(tmp_path / "x.inter", "item_id:token\tuser_id:token\nb\ta\nc\ta\nb\td\n")
    data = read_recbole(tmp_path)
    assert not data.has_timestamps
    assert data.interactions.to_pydict() == {
        "user_id": ["a", "a", "d"],
        "item_id": ["b", "c", "b"],
        "timestamp": [0, 1, 2],
    }


def test_name_picks_one_of_several(tmp_path: Path) -> None:
    write(tmp_path / "a.inter", INTER)
    write(tmp_path / "b.inter", "user_id:token\titem_id:token\nx\ty\n")
    write(tmp_path / "b.item", "item_id:token\ttitle:token\ny\tWhy\n")
    data = read_recbole(tmp_path, "b")
    assert data.interactions["user_id"].to_pylist() == ["x"]
    assert data.items is not None
    assert data.items.to_pydict() == {"item_id": ["y"], "title": ["Why"]}
    with pytest.raises(DataError, match=r"found a\.inter, b\.inter; pass the dataset name") as err:
        read_recbole(tmp_path)
    assert err.value.path == str(tmp_path)


# --- malformed input -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ("user_id:int\titem_id:token\nu\ti\n", 1, "header field 'user_id:int' is not name:type"),
        ("user_id:token\trating:float\nu\t1\n", 1, "no 'item_id' field in the header"),
        ("user_id:token\titem_id:token\trating:float\nu\ti\t4\nu\ti\tgood\n", 3, "'good' is not a float"),
        ("user_id:token\titem_id:token\ttimestamp:float\nu\ti\t4\nu\ti\n", 3, "expected 3 fields separated by '\\t'"),
        ("user_id:token\titem_id:token\ttimestamp:float\nu\ti\t4\nu\ti\tnan\n", 3, "holds non-finite timestamps"),
        ("user_id:token\titem_id:token\ttimestamp:float\nu\ti\tinf\nu\ti\t4\n", 2, "holds non-finite timestamps"),
        ("user_id:token\titem_id:token\ttimestamp:float\nu\ti\t4\n\nu\ti\t-inf\n", 4, "holds non-finite timestamps"),
        ("user_id:token\titem_id:token\ttimestamp:float\nu\ti\t4\nu\ti\t4.5\nu\ti\tsoon\n", 4,
         "column 'timestamp:float': 'soon' is not a float"),
        ("user_id:token\titem_id:token\ttimestamp:float\nu\ti\t4\nu\ti\t\n", 3, "'' is not a float"),
        ("user_id:token\titem_id:token\ttimestamp:float\nu\ti\t" + "9" * 100_000 + "x\n", 2, "'" + "9" * 80 + "'… is"),
        ("user_id:token\titem_id:token\trating:float\nu\ti\t4\nu\ti\tNaN\n", 3, "holds non-finite ratings"),
        (b"user_id:token\titem_id:token\nu\t\xffi\n", 2, "not valid utf-8"),
        ("", None, "file is empty"),
    ],
)
def test_malformed_inter(tmp_path: Path, text: str | bytes, line: int | None, message: str) -> None:
    inter = write(tmp_path / "bad.inter", text)
    with pytest.raises(DataError) as err:
        read_recbole(tmp_path)
    assert (err.value.path, err.value.line) == (str(inter), line)
    assert message in str(err.value)
    assert "bad.inter" in str(err.value)


def test_non_numeric_float_in_item_file(tmp_path: Path) -> None:
    write(tmp_path / "x.inter", INTER)
    items = write(tmp_path / "x.item", "item_id:token\tprice:float\ni9\t1.5\ni7\tcheap\n")
    with pytest.raises(DataError, match=r"x\.item:3: column 'price:float': 'cheap' is not a float") as err:
        read_recbole(tmp_path)
    assert err.value.path == str(items)


def test_missing_named_inter_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"nope\.inter: no such file"):
        read_recbole(tmp_path, "nope")


def test_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no such folder"):
        read_recbole(tmp_path / "absent")


@needs_shared_data
def test_real_ml100k_atomic_files() -> None:
    data = read_recbole(SHARED_DATA / "ml-100k")
    assert data.source == "recbole"
    assert data.interactions.num_rows == 100_000
    assert data.interactions.schema.field("timestamp").type == pa.int64()
    assert data.items is not None
    assert data.items.num_rows == 1682
    assert data.users is not None
    assert data.users.num_rows == 943
    first = data.items.slice(0, 1).to_pylist()[0]
    assert first == {
        "item_id": "1",
        "title": "Toy Story",
        "year": 1995,
        "genres": ["Animation", "Children's", "Comedy"],
    }
