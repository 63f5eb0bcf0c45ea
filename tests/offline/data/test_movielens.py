from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest

from common.errors import SeqrecError
from offline.data.errors import DataError
from offline.data.readers.movielens import RELEASES, read_movielens

SHARED_DATA = Path(__file__).resolve().parents[3].parent / "shared" / "data"
needs_shared_data = pytest.mark.skipif(not SHARED_DATA.is_dir(), reason=f"real data copies not found at {SHARED_DATA}")

# u.item flags, in the standard order: unknown Action Adventure Animation Children's Comedy
# Crime Documentary Drama Fantasy Film-Noir Horror Musical Mystery Romance Sci-Fi Thriller War Western
U_ITEM = (
    "10|Café au Lait (1993)|01-Jan-1993||http://imdb/x|0|0|0|0|0|1|0|0|0|0|0|0|0|0|1|0|0|0|0\n"
    "20|Land Before Time III (1995) (V)|01-Jan-1995||http://imdb/y|0|0|0|1|1|0|0|0|0|0|0|0|0|0|0|0|0|0|0\n"
    "30|unknown||||1|0|0|0|0|0|0|0|0|0|0|0|0|0|0|0|0|0|0\n"
)


def write(path: Path, text: str | bytes, encoding: str = "utf-8") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text if isinstance(text, bytes) else text.encode(encoding))
    return path


def write_100k(folder: Path) -> Path:
    write(folder / "u.data", "3\t10\t4\t881250949\n1\t20\t5\t881250950\n3\t20\t1\t881250000\n1\t30\t2\t881250001\n")
    write(folder / "u.item", U_ITEM, encoding="iso-8859-1")
    write(folder / "u.user", "1|24|M|technician|85711\n3|53|F|other|94043\n")
    return folder


def write_1m(folder: Path) -> Path:
    write(folder / "ratings.dat", "2::1193::5::978300760\n1::661::3::978302109\n2::914::3::978301968\n")
    movies = (
        "1193::One Flew Over the Cuckoo's Nest (1975)::Drama\n"
        "661::Métisse (Café au Lait) (1993)::Comedy\n"
        "914::Heidi Fleiss: Hollywood Madam (1995) ::Documentary|Drama\n"
    )
    write(folder / "movies.dat", movies, encoding="iso-8859-1")
    write(folder / "users.dat", "1::F::1::10::48067\n2::M::56::16::70072\n")
    return folder


def write_10m(folder: Path) -> Path:
    write(folder / "ratings.dat", "5::122::3.5::838985046\n5::185::5::838983525\n")
    write(folder / "movies.dat", "122::Café Society (1995)::Drama\n185::Meet the Feebles::(no genres listed)\n")
    return folder


def write_20m(folder: Path) -> Path:
    write(folder / "ratings.csv", "userId,movieId,rating,timestamp\n7,11,4.5,1112486027\n1,2,3.0,1112484676\n")
    movies = (
        "movieId,title,genres\n"
        '11,"American President, The (1995)",Comedy|Drama|Romance\n'
        "2,Jumanji (1995),Adventure|Children|Fantasy\n"
        '3,"Babylon 5, part two",(no genres listed)\n'
    )
    write(folder / "movies.csv", movies)
    return folder


def columns(table: pa.Table | None) -> dict[str, list[object]]:
    assert table is not None
    return table.to_pydict()


INTERACTION_SCHEMA = pa.schema(
    [("user_id", pa.string()), ("item_id", pa.string()), ("timestamp", pa.int64()), ("rating", pa.float64())]
)
ITEM_SCHEMA = pa.schema(
    [("item_id", pa.string()), ("title", pa.string()), ("year", pa.int32()), ("genres", pa.list_(pa.string()))]
)


def test_ml100k_raw_files(tmp_path: Path) -> None:
    folder = write_100k(tmp_path)
    data = read_movielens(folder, "ml-100k")
    assert data.source == "ml-100k"
    assert data.has_timestamps
    assert data.interactions.schema == INTERACTION_SCHEMA
    assert columns(data.interactions) == {
        "user_id": ["3", "1", "3", "1"],
        "item_id": ["10", "20", "20", "30"],
        "timestamp": [881250949, 881250950, 881250000, 881250001],
        "rating": [4.0, 5.0, 1.0, 2.0],
    }
    assert data.items is not None
    assert data.items.schema == ITEM_SCHEMA
    assert columns(data.items) == {
        "item_id": ["10", "20", "30"],
        "title": ["Café au Lait (1993)", "Land Before Time III (1995) (V)", "unknown"],
        "year": [1993, 1995, None],  # 20: no trailing "(YYYY)", so the release date's year
        "genres": [["Comedy", "Romance"], ["Animation", "Children's"], []],
    }
    assert columns(data.users) == {
        "user_id": ["1", "3"],
        "age": [24, 53],
        "gender": ["M", "F"],
        "occupation": ["technician", "other"],
        "zip_code": ["85711", "94043"],
    }
    assert data.users is not None
    assert data.users.schema.field("age").type == pa.int32()
    assert data.files == [folder / "u.data", folder / "u.item", folder / "u.user"]


def test_ml100k_genre_names_come_from_u_genre(tmp_path: Path) -> None:
    write(tmp_path / "u.data", "1\t7\t4\t100\n")
    write(tmp_path / "u.genre", "unknown|0\nDrama|1\nWar|2\n\n")
    write(tmp_path / "u.item", "7|Paths of Glory (1957)|01-Jan-1957||http://imdb/z|0|1|1\n")
    data = read_movielens(tmp_path, "ml-100k")
    assert columns(data.items)["genres"] == [["Drama", "War"]]
    assert data.users is None
    assert tmp_path / "u.genre" in data.files


def test_ml1m_from_parent_folder(tmp_path: Path) -> None:
    write_1m(tmp_path / "ml-1m")
    data = read_movielens(tmp_path, "ml-1m")
    assert data.source == "ml-1m"
    assert data.interactions.schema == INTERACTION_SCHEMA
    assert columns(data.interactions) == {
        "user_id": ["2", "1", "2"],
        "item_id": ["1193", "661", "914"],
        "timestamp": [978300760, 978302109, 978301968],
        "rating": [5.0, 3.0, 3.0],
    }
    assert columns(data.items) == {
        "item_id": ["1193", "661", "914"],
        "title": [
            "One Flew Over the Cuckoo's Nest (1975)",
            "Métisse (Café au Lait) (1993)",
            "Heidi Fleiss: Hollywood Madam (1995) ",
        ],
        "year": [1975, 1993, 1995],
        "genres": [["Drama"], ["Comedy"], ["Documentary", "Drama"]],
    }
    assert columns(data.users) == {
        "user_id": ["1", "2"],
        "gender": ["F", "M"],
        "age": [1, 56],
        "occupation": ["10", "16"],
        "zip_code": ["48067", "70072"],
    }
    folder = tmp_path / "ml-1m"
    assert data.files == [folder / "ratings.dat", folder / "movies.dat", folder / "users.dat"]


def test_ml10m_utf8_movies_and_no_users(tmp_path: Path) -> None:
    write_10m(tmp_path / "ml-10M100K")
    data = read_movielens(tmp_path, "ml-10m")
    assert columns(data.interactions) == {
        "user_id": ["5", "5"],
        "item_id": ["122", "185"],
        "timestamp": [838985046, 838983525],
        "rating": [3.5, 5.0],
    }
    assert columns(data.items) == {
        "item_id": ["122", "185"],
        "title": ["Café Society (1995)", "Meet the Feebles"],
        "year": [1995, None],
        "genres": [["Drama"], []],
    }
    assert data.users is None


def test_ml20m_quoted_titles(tmp_path: Path) -> None:
    folder = write_20m(tmp_path / "ml-20m")
    data = read_movielens(folder, "ml-20m")
    assert data.interactions.schema == INTERACTION_SCHEMA
    assert columns(data.interactions) == {
        "user_id": ["7", "1"],
        "item_id": ["11", "2"],
        "timestamp": [1112486027, 1112484676],
        "rating": [4.5, 3.0],
    }
    assert data.items is not None
    assert data.items.schema == ITEM_SCHEMA
    assert columns(data.items) == {
        "item_id": ["11", "2", "3"],
        "title": ["American President, The (1995)", "Jumanji (1995)", "Babylon 5, part two"],
        "year": [1995, 1995, None],
        "genres": [["Comedy", "Drama", "Romance"], ["Adventure", "Children", "Fantasy"], []],
    }
    assert data.users is None
    assert data.files == [folder / "ratings.csv", folder / "movies.csv"]


@pytest.mark.parametrize(("variant", "writer"), [("ml-10m", write_20m), ("ml-20m", write_10m)])
def test_layout_is_found_from_the_files(tmp_path: Path, variant: str, writer: Callable[[Path], Path]) -> None:
    writer(tmp_path)
    data = read_movielens(tmp_path, variant)
    assert data.source == variant
    assert data.interactions.num_rows == 2


def test_ml100k_recbole_copy(tmp_path: Path) -> None:
    write(
        tmp_path / "ml-100k.inter",
        "user_id:token\titem_id:token\trating:float\ttimestamp:float\n3\t10\t4\t881250949\n1\t30\t2\t881250001\n",
    )
    write(
        tmp_path / "ml-100k.item",
        "item_id:token\tmovie_title:token_seq\trelease_year:token\tclass:token_seq\n"
        "10\tCafé au Lait\t1993\tComedy Romance\n"
        "20\tLand Before Time III (1995)\tV\tAnimation Children's\n"
        "30\tunkonwn\tunkonwn\tunknown\n",
    )
    write(tmp_path / "ml-100k.user", "user_id:token\tage:token\tgender:token\n1\t24\tM\n3\t53\tF\n")
    data = read_movielens(tmp_path, "ml-100k")
    assert data.source == "ml-100k"
    assert data.interactions.schema == INTERACTION_SCHEMA
    assert columns(data.interactions)["timestamp"] == [881250949, 881250001]
    assert columns(data.items) == {
        "item_id": ["10", "20", "30"],
        "title": ["Café au Lait", "Land Before Time III (1995)", "unkonwn"],
        "year": [1993, 1995, None],  # 20: RecBole's year "V", so the title's
        "genres": [["Comedy", "Romance"], ["Animation", "Children's"], []],
    }
    assert columns(data.users) == {"user_id": ["1", "3"], "age": [24, 53], "gender": ["M", "F"]}


def test_raw_files_win_over_recbole_files(tmp_path: Path) -> None:
    write_100k(tmp_path)
    write(tmp_path / "ml-100k.inter", "user_id:token\titem_id:token\n9\t9\n")
    assert read_movielens(tmp_path, "ml-100k").interactions.num_rows == 4


def test_known_releases() -> None:
    assert {v: (r.md5, r.folder) for v, r in RELEASES.items()} == {
        "ml-100k": ("0e33842e24a9c977be4e0107933c0723", "ml-100k"),
        "ml-1m": ("c4d9eecfca2ab87c1945afe126590906", "ml-1m"),
        "ml-10m": ("ce571fd55effeba0271552578f2648bd", "ml-10M100K"),
        "ml-20m": ("cd245b17a1ae2cc31bb14903e1204af3", "ml-20m"),
    }
    assert RELEASES["ml-10m"].url == "https://files.grouplens.org/datasets/movielens/ml-10m.zip"


def test_spaces_around_ids_are_no_part_of_them(tmp_path: Path) -> None:
    write_1m(tmp_path)
    write(tmp_path / "ratings.dat", "2::1193::5::978300760\n1:: 661::3::978302109\n2 ::914 ::3::978301968\n")
    movies = "1193::Cuckoo's Nest (1975)::Drama\n 661 ::Métisse (1993)::Comedy\n914::Heidi::Drama\n"
    write(tmp_path / "movies.dat", movies, encoding="iso-8859-1")
    write(tmp_path / "users.dat", "1 ::F::1::10::48067\n2::M::56::16::70072\n")
    data = read_movielens(tmp_path, "ml-1m")
    assert columns(data.interactions)["user_id"] == ["2", "1", "2"]
    assert columns(data.interactions)["item_id"] == ["1193", "661", "914"]
    assert columns(data.items)["item_id"] == ["1193", "661", "914"]
    assert columns(data.users)["user_id"] == ["1", "2"]


@pytest.mark.parametrize(
    ("name", "encoding"), [("movies.dat", "iso-8859-1"), ("movies.dat", "utf-8"), ("u.item", "iso-8859-1")]
)
def test_a_byte_order_mark_keeps_the_first_items_metadata(tmp_path: Path, name: str, encoding: str) -> None:
    if name == "movies.dat":
        write_1m(tmp_path)
    else:
        write_100k(tmp_path)
    path = tmp_path / name
    write(path, b"\xef\xbb\xbf" + path.read_bytes().decode("iso-8859-1").encode(encoding))
    data = read_movielens(tmp_path, "ml-1m" if name == "movies.dat" else "ml-100k")
    first = columns(data.items)
    assert first["item_id"][0] == ("1193" if name == "movies.dat" else "10")
    assert first["title"][0] in ("One Flew Over the Cuckoo's Nest (1975)", "Café au Lait (1993)")


# --- malformed input -----------------------------------------------------------------


def test_truncated_line(tmp_path: Path) -> None:
    write_1m(tmp_path)
    ratings = write(tmp_path / "ratings.dat", "1::10::5::100\n1::11::5\n")
    with pytest.raises(DataError, match=r"ratings\.dat:2: expected 4 fields") as err:
        read_movielens(tmp_path, "ml-1m")
    assert (err.value.path, err.value.line) == (str(ratings), 2)


def test_wrong_separator(tmp_path: Path) -> None:
    write_1m(tmp_path)
    ratings = write(tmp_path / "ratings.dat", "1,10,5,100\n")
    with pytest.raises(DataError, match="separated by '::'") as err:
        read_movielens(tmp_path, "ml-1m")
    assert (err.value.path, err.value.line) == (str(ratings), 1)


def test_non_numeric_timestamp(tmp_path: Path) -> None:
    write_100k(tmp_path)
    ratings = write(tmp_path / "u.data", "1\t10\t5\t100\n1\t11\t4\tyesterday\n")
    with pytest.raises(DataError, match=r"u\.data:2: column 'timestamp': 'yesterday' is not an int") as err:
        read_movielens(tmp_path, "ml-100k")
    assert err.value.path == str(ratings)


@pytest.mark.parametrize("rating", ["nan", "inf", "-Infinity"])
@pytest.mark.parametrize(
    ("writer", "variant", "name", "lines", "line"),
    [
        (write_100k, "ml-100k", "u.data", "1\t10\t5\t100\n1\t20\t{}\t101\n", 2),
        (write_1m, "ml-1m", "ratings.dat", "1::1193::5::100\n\n1::661::{}::101\n", 3),
        (write_20m, "ml-20m", "ratings.csv", "userId,movieId,rating,timestamp\n7,11,{},1\n", 2),
    ],
)
def test_non_finite_rating(tmp_path: Path, rating: str, writer: Callable[[Path], Path], variant: str, name: str,
                           lines: str, line: int) -> None:
    writer(tmp_path)
    ratings = write(tmp_path / name, lines.format(rating))
    with pytest.raises(DataError, match="column 'rating' holds a non-finite rating") as err:
        read_movielens(tmp_path, variant)
    assert (err.value.path, err.value.line) == (str(ratings), line)


def test_non_utf8_in_ml20m_movies(tmp_path: Path) -> None:
    write_20m(tmp_path)
    movies = write(tmp_path / "movies.csv", b"movieId,title,genres\n1,Caf\xe9 (1990),Drama\n")
    with pytest.raises(DataError, match=r"movies\.csv:2: not valid utf-8") as err:
        read_movielens(tmp_path, "ml-20m")
    assert err.value.path == str(movies)


def test_empty_ratings_file(tmp_path: Path) -> None:
    write_100k(tmp_path)
    ratings = write(tmp_path / "u.data", "")
    with pytest.raises(DataError, match="empty") as err:
        read_movielens(tmp_path, "ml-100k")
    assert (err.value.path, err.value.line) == (str(ratings), None)


def test_missing_items_file(tmp_path: Path) -> None:
    write_100k(tmp_path)
    (tmp_path / "u.item").unlink()
    with pytest.raises(DataError, match=r"u\.item: no such file") as err:
        read_movielens(tmp_path, "ml-100k")
    assert err.value.path == str(tmp_path / "u.item")


def test_no_known_files(tmp_path: Path) -> None:
    write(tmp_path / "README", "nothing here")
    with pytest.raises(DataError, match=r"looked for u\.data, ratings\.dat, ratings\.csv, \*\.inter") as err:
        read_movielens(tmp_path, "ml-20m")
    assert err.value.path == str(tmp_path)
    assert "ml-20m/" in str(err.value)


def test_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no such folder"):
        read_movielens(tmp_path / "absent", "ml-1m")


def test_unknown_variant(tmp_path: Path) -> None:
    with pytest.raises(SeqrecError, match="ml-25m"):
        read_movielens(tmp_path, "ml-25m")


# --- the real copies in shared/data (skipped where absent) -------------------------------


@needs_shared_data
@pytest.mark.parametrize("subpath", ["ml-100k", "ml-100k/raw"])
def test_real_ml100k_counts(subpath: str) -> None:
    data = read_movielens(SHARED_DATA / subpath, "ml-100k")
    assert data.source == "ml-100k"
    assert data.interactions.num_rows == 100_000
    assert len(set(data.interactions["user_id"].to_pylist())) == 943
    assert len(set(data.interactions["item_id"].to_pylist())) == 1682
    assert data.items is not None
    assert data.items.num_rows == 1682
    assert data.users is not None
    assert data.users.num_rows == 943


@needs_shared_data
def test_real_ml100k_copies_agree() -> None:
    raw = read_movielens(SHARED_DATA / "ml-100k" / "raw", "ml-100k")
    recbole = read_movielens(SHARED_DATA / "ml-100k", "ml-100k")
    assert raw.interactions.equals(recbole.interactions)
    assert raw.items is not None
    assert recbole.items is not None
    for column in ("item_id", "year", "genres"):
        assert raw.items[column].equals(recbole.items[column])
    assert raw.users is not None
    assert raw.users.equals(recbole.users)
