import pyarrow as pa
import pytest

from offline.data.errors import DataError
from offline.data.readers.textio import read_delimited

NAMES = ["user", "item", "rating", "ts"]
TYPES = {"ts": pa.int64()}


def test_reads_typed_columns_in_file_order(write):
    path = write("u.data", "3\t1\t5\t30\n1\t2\t4\t10\n")
    table = read_delimited(path, sep="\t", names=NAMES, types=TYPES)
    assert table.column("user").to_pylist() == ["3", "1"]
    assert table.column("ts").to_pylist() == [30, 10]


def test_multi_character_separator_and_latin1(write):
    path = write("movies.dat", "1::Caf\xe9 (1999)::Drama|War\n".encode("latin-1"))
    table = read_delimited(path, sep="::", names=["id", "title", "genres"], encoding="latin-1")
    assert table.to_pylist() == [{"id": "1", "title": "Café (1999)", "genres": "Drama|War"}]


@pytest.mark.parametrize(
    ("content", "line", "reason"),
    [
        (b"1\t2\t3\t4\n1\t2\t3\n", 2, "expected 4 fields separated by '\\\\t', found 3"),  # truncated line
        (b"1\t2\t3\t4\n1,2,3,4\n1\t2\t3\t4\n", 2, "found 1"),  # wrong separator
        (b"1\t2\t3\t4\n1\t2\t3\tsoon\n", 2, "column 'ts': 'soon' is not an int"),
        (b"1\t2\t3\t4\n1\t2\t3\t\n", 2, "column 'ts': '' is not an int"),  # empty typed field, never a null
        (b"1\t2\t3\t4\n\n1\t\xff\t3\t4\n", 3, "not valid utf-8"),
    ],
)
def test_bad_lines_are_named(write, content, line, reason):
    path = write("u.data", content)
    with pytest.raises(DataError, match=reason) as info:
        read_delimited(path, sep="\t", names=NAMES, types=TYPES)
    assert info.value.line == line
    assert str(info.value).startswith(f"{path}:{line}: ")


def test_missing_and_empty_files(write, tmp_path):
    with pytest.raises(DataError, match="no such file"):
        read_delimited(tmp_path / "nope.csv", sep=",", header=True)
    with pytest.raises(DataError, match="empty"):
        read_delimited(write("empty.csv", "\n\n"), sep=",", header=True)
    with pytest.raises(DataError, match="no data rows"):
        read_delimited(write("header_only.csv", "a,b\n"), sep=",", header=True)


def test_unknown_column_lists_the_columns(write):
    path = write("log.csv", "userId,movieId\n1,2\n")
    with pytest.raises(DataError, match=r"no column 'user_id' \(columns: userId, movieId\)"):
        read_delimited(path, sep=",", header=True, columns=["user_id"])
