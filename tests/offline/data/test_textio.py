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


def _multiline_log(n_rows: int) -> str:
    """A quoted CSV where every third item id holds a line break: row r starts on line 2 + r + (r + 2) // 3."""
    rows = [f'{r},"it\n{r}",{r}' if r % 3 == 0 else f"{r},{r},{r}" for r in range(n_rows)]
    return "user,item,ts\n" + "\n".join(rows) + "\n"


@pytest.mark.parametrize("n_rows", [10, 60_000])  # 60 000 rows is over 1 MB: Arrow reads it in blocks
def test_quoted_fields_hold_line_breaks_in_any_file(write, n_rows):
    path = write("log.csv", _multiline_log(n_rows))
    table = read_delimited(path, sep=",", header=True, quoted=True, types={"ts": pa.int64()})
    assert table.num_rows == n_rows
    assert table.column("item").to_pylist()[:4] == ["it\n0", "1", "2", "it\n3"]


def test_lines_are_counted_in_the_file_past_quoted_line_breaks(write):
    text = _multiline_log(9)
    bad_ts = write("bad_ts.csv", text.replace("7,7,7", "7,7,soon"))
    with pytest.raises(DataError, match="column 'ts': 'soon' is not an int") as info:
        read_delimited(bad_ts, sep=",", header=True, quoted=True, types={"ts": pa.int64()})
    assert info.value.line == 12  # 2 + 7 + (7 + 2) // 3
    no_id = write("no_id.csv", text.replace("7,7,7", ",7,7"))
    with pytest.raises(DataError, match="column 'user' is empty") as info:
        read_delimited(no_id, sep=",", header=True, quoted=True, non_empty=["user"])
    assert info.value.line == 12  # 2 + 7 + (7 + 2) // 3


def test_a_quote_left_open_is_an_error_not_a_field_to_the_end(write):
    path = write("log.csv", 'user,item,ts\n1,10,100\n2,"20,200\n3,30,300\n')
    with pytest.raises(DataError, match="unclosed quote") as info:
        read_delimited(path, sep=",", header=True, quoted=True)
    assert info.value.line == 3


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("99999999999999999999", "'99999999999999999999' is out of range for int64"),  # Python's int() takes these
        ("1_02", "'1_02' is not an int"),
    ],
)
def test_values_arrow_refuses_are_named_with_their_line(write, value, reason):
    path = write("u.data", f"1\t2\t3\t4\n1\t2\t3\t{value}\n")
    with pytest.raises(DataError, match=reason) as info:
        read_delimited(path, sep="\t", names=NAMES, types=TYPES)
    assert info.value.line == 2


def test_a_long_bad_value_is_cut_in_the_message(write):
    path = write("u.data", "1\t2\t3\t4\n1\t2\t3\t" + "x" * 2_000_000 + "\n")
    with pytest.raises(DataError, match=r"column 'ts': 'x{80}'… is not an int") as info:
        read_delimited(path, sep="\t", names=NAMES, types=TYPES)
    assert info.value.line == 2
    assert len(str(info.value)) < 300


@pytest.mark.parametrize("encoding", ["utf-8", "latin-1"])
def test_a_byte_order_mark_is_no_part_of_the_first_field(write, encoding):
    path = write("movies.dat", b"\xef\xbb\xbf" + "10::Caf\xe9 (1999)::Drama\n".encode(encoding))
    table = read_delimited(path, sep="::", names=["id", "title", "genres"], encoding=encoding)
    assert table.to_pylist() == [{"id": "10", "title": "Café (1999)", "genres": "Drama"}]


def test_trimmed_columns_lose_surrounding_spaces(write):
    path = write("ratings.dat", "1:: 20::5::101\n2 ::10::4::102\n3::  ::4::103\n")
    with pytest.raises(DataError, match="column 'item' is empty") as info:
        read_delimited(path, sep="::", names=NAMES, types=TYPES, trimmed=["user", "item"], non_empty=["item"])
    assert info.value.line == 3
    path.write_text("1:: 20::5::101\n2 ::10::4::102\n")
    table = read_delimited(path, sep="::", names=NAMES, types=TYPES, trimmed=["user", "item"])
    assert table.column("user").to_pylist() == ["1", "2"]
    assert table.column("item").to_pylist() == ["20", "10"]
