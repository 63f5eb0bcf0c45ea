import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from common.errors import SeqrecError
from offline.data.errors import DataError
from offline.data.readers.tabular import parse_sep, read_tabular


def test_csv_with_named_columns(write):
    path = write("log.csv", "uid,iid,when,rating\n7,a,100,5\n7,b,90,3\n")
    raw = read_tabular(path, user_col="uid", item_col="iid", time_col="when")
    assert raw.interactions.to_pydict() == {"user_id": ["7", "7"], "item_id": ["a", "b"], "timestamp": [100, 90]}


def test_tsv_iso_dates_and_no_clock(write):
    path = write("log.tsv", "u\ti\tt\n1\tx\t2024-01-02 00:00:00\n1\ty\t2024-01-01T12:00:00\n")
    raw = read_tabular(path, user_col="u", item_col="i", time_col="t", sep="\t")
    assert raw.interactions.column("timestamp").to_pylist() == [1704153600, 1704110400]
    raw = read_tabular(path, user_col="u", item_col="i", time_col=None, sep="\t")
    assert raw.interactions.column("timestamp").to_pylist() == [0, 1]
    assert not raw.has_timestamps


def test_fractional_times_stay_float(write):
    raw = read_tabular(write("log.csv", "user_id,item_id,timestamp\n1,a,1.5\n1,b,1.25\n"))
    assert raw.interactions.column("timestamp").to_pylist() == [1.5, 1.25]


def test_parquet(tmp_path):
    path = tmp_path / "log.parquet"
    pq.write_table(pa.table({"user": [1, 1], "item": [10, 11], "ts": [5, 6], "extra": ["p", "q"]}), path)
    raw = read_tabular(path, user_col="user", item_col="item", time_col="ts")
    assert raw.interactions.to_pydict() == {"user_id": ["1", "1"], "item_id": ["10", "11"], "timestamp": [5, 6]}
    with pytest.raises(DataError, match=r"no column 'uid' \(columns: user, item, ts, extra\)"):
        read_tabular(path, user_col="uid", item_col="item", time_col="ts")


def test_bad_time_value_is_named(write):
    path = write("log.csv", "user_id,item_id,timestamp\n1,a,5\n1,b,yesterday\n")
    with pytest.raises(DataError, match="'yesterday' is neither a number nor an ISO date"):
        read_tabular(path)


def test_iso_dates_with_a_zone_are_read_in_utc(write):
    """They were refused as "neither a number nor an ISO date": exports with Z or an offset are common."""
    raw = read_tabular(write("log.csv", "user_id,item_id,timestamp\n1,a,2020-01-01T10:00:00Z\n"
                             "1,b,2020-01-01T11:00:00+02:00\n1,c,2020-01-01T10:30:00.5Z\n"))
    assert raw.interactions.column("timestamp").to_pylist() == [1577872800, 1577869200, 1577874600.5]
    with pytest.raises(DataError, match=r"log.csv:3: column 'timestamp' mixes dates and dates with a zone: "
                                        r"'2020-01-01 12:00:00' here, '2020-01-01T10:00:00Z' at line 2"):
        read_tabular(write("log.csv", "user_id,item_id,timestamp\n1,a,2020-01-01T10:00:00Z\n1,b,2020-01-01 12:00:00\n"))


def test_unknown_column(write):
    with pytest.raises(DataError, match="no column 'user_id'"):
        read_tabular(write("log.csv", "a,b,c\n1,2,3\n"))


def test_sep_escapes_are_decoded_and_bad_separators_refused():
    assert [parse_sep(text) for text in ("\\t", ";", "¦", "\\\\")] == ["\t", ";", "¦", "\\"]
    with pytest.raises(SeqrecError, match=r"--sep '\\\\' holds an incomplete backslash escape"):
        parse_sep("\\")
    for text in (";;", "", "\\n"):
        with pytest.raises(SeqrecError, match="--sep must be one character other than a line break"):
            parse_sep(text)


def test_items_file_may_not_use_the_prepared_key_names(write):
    log = write("log.csv", "user_id,sku,timestamp\n1,a,5\n")
    items = write("items.csv", "sku,item_id,title\na,A1,Apple\n")
    with pytest.raises(DataError, match=r"items.csv:1: column 'item_id' is a name seqrec prepare keeps for its own"):
        read_tabular(log, item_col="sku", items_path=items)
    raw = read_tabular(log, item_col="sku", items_path=write("items.csv", "sku,title\na,Apple\n"))
    assert raw.items is not None
    assert raw.items.to_pydict() == {"item_id": ["a"], "title": ["Apple"]}


def test_parquet_column_named_twice(write, tmp_path):
    items = tmp_path / "items.parquet"
    pq.write_table(pa.Table.from_arrays([pa.array([1]), pa.array(["A"]), pa.array(["B"])],
                                        names=["item_id", "title", "title"]), items)
    with pytest.raises(DataError, match=r"items.parquet: column 'title' appears 2 times; rename all but one"):
        read_tabular(write("log.csv", "user_id,item_id,timestamp\n1,1,5\n"), items_path=items)


def test_a_tsv_reads_quotes_as_they_are(write):
    """A TSV has no quoting: '"big" box' lost its quotes and became 'big box'."""
    raw = read_tabular(write("log.tsv", 'u\ti\tt\n1\t"big" box\t2\n1\t"a"\t3\n'), user_col="u", item_col="i",
                       time_col="t", sep="\t")
    assert raw.interactions.column("item_id").to_pylist() == ['"big" box', '"a"']
    quoted = read_tabular(write("log.csv", 'u,i,t\n1,"a, b",2\n'), user_col="u", item_col="i", time_col="t")
    assert quoted.interactions.column("item_id").to_pylist() == ["a, b"]  # a CSV's quotes still quote


def _parquet_clock(tmp_path, values, type_):
    path = tmp_path / "log.parquet"
    pq.write_table(pa.table({"user_id": ["1"] * len(values), "item_id": [f"i{n}" for n in range(len(values))],
                             "timestamp": pa.array(values, type_)}), path)
    return path


def test_clocks_arrow_cannot_cast_to_microseconds_are_one_line(tmp_path):
    """Each was an internal error (ArrowInvalid) before."""
    exact = _parquet_clock(tmp_path, [1_600_000_000_000_001_000, 1_600_000_000_000_000_000], pa.timestamp("ns"))
    assert read_tabular(exact).interactions.column("timestamp").to_pylist() == [1600000000.000001, 1600000000.0]
    finer = _parquet_clock(tmp_path, [1_600_000_000_000_000_000, 1_600_000_000_000_000_003], pa.timestamp("ns"))
    with pytest.raises(DataError, match=r"row 2: column 'timestamp' holds times finer than a microsecond"):
        read_tabular(finer)
    huge = _parquet_clock(tmp_path, [5, 2**63 + 5], pa.uint64())
    with pytest.raises(DataError, match=r"row 2: column 'timestamp' holds a timestamp above 2\*\*63 - 1"):
        read_tabular(huge)


def test_iso_dates_in_any_string_type_and_to_the_nanosecond(tmp_path, write):
    dates = _parquet_clock(tmp_path, ["2020-01-01T00:00:01Z", "2020-01-01T00:00:00Z"], pa.large_string())
    assert read_tabular(dates).interactions.column("timestamp").to_pylist() == [1577836801, 1577836800]
    path = write("log.csv", "user_id,item_id,timestamp\n1,a,2020-01-01T00:00:00.000000001Z\n")
    with pytest.raises(DataError, match="holds times finer than a microsecond"):  # was 'neither a number nor'
        read_tabular(path)


def test_an_empty_genre_is_no_genre(write):
    items = write("items.csv", "item_id,genres\na,\nb,Drama||War\n")
    raw = read_tabular(write("log.csv", "user_id,item_id,timestamp\n1,a,1\n1,b,2\n"), items_path=items)
    assert raw.items.column("genres").to_pylist() == [[], ["Drama", "War"]]  # [''] and ['Drama', '', 'War'] before


def test_lines_are_counted_past_quoted_line_breaks_and_values_cut(write):
    """A quoted field's line break counted as a row: the error named line 4 for the bad value on line 5; and a
    2 MB timestamp made a 2 MB error line."""
    path = write("log.csv", 'user_id,item_id,timestamp\n1,"two\nlines",1\n1,b,2\n1,c,later\n')
    with pytest.raises(DataError, match="'later' is neither a number nor an ISO date") as info:
        read_tabular(path)
    assert info.value.line == 5
    path = write("big.csv", "user_id,item_id,timestamp\n1,a," + "x" * 2_000_000 + "\n")
    with pytest.raises(DataError) as info:
        read_tabular(path)
    assert len(str(info.value)) < 300
