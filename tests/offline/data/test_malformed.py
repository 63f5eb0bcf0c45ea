"""Damaged input through `seqrec prepare`, for every reader: truncated lines, wrong separators, bytes that are
not UTF-8, missing columns, empty files, duplicate rows (and a few relatives: byte-order marks, empty ids, bad
numbers, broken Parquet).

Each case ends one of two ways, never in a traceback or a silently wrong result:

- ``Fails``: exit 1 and one line on stderr, ``seqrec: error: <file>:<line>: <reason>`` (no line where the damage
  is not on one: an empty file, a JSON document; a Parquet file names the row instead);
- ``Reads``: exit 0 with exactly the sequences stated written out (a documented skip warns with its count).

The duplicate-row rule (docs/reference/formats.md, "The prepared folder"): rows with the same user, item and
timestamp are one interaction logged twice, so the later copies are dropped and counted in a warning; the same item
again at another time is a repeat and stays. Files without a clock (S3-Rec lines, CSV without --time-col) have no
duplicates: each row is its own step. Duplicate metadata rows (an item or user listed twice) are an error naming
both lines.
"""

from __future__ import annotations

import io
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from offline.cli import main

Files = dict[str, bytes]


def lines(*rows: str) -> bytes:
    return "".join(f"{row}\n" for row in rows).encode()


def flags(on: int) -> str:
    return "|".join("1" if g == on else "0" for g in range(19))


# Valid datasets: two users with three interactions each (the least `prepare` keeps), items 10, 20, 30.
ML100K: Files = {
    "u.data": lines("1\t10\t4\t100", "1\t20\t5\t101", "1\t30\t3\t102", "2\t10\t4\t200", "2\t30\t2\t201",
                    "2\t20\t1\t202"),
    "u.item": lines(f"10|Toy Story (1995)|01-Jan-1995||http://x|{flags(3)}",
                    f"20|Heat (1995)|01-Jan-1995||http://y|{flags(1)}",
                    f"30|Fargo (1996)|01-Jan-1996||http://z|{flags(6)}"),
    "u.user": lines("1|24|M|technician|85711", "2|53|F|other|94043"),
}
ML1M: Files = {
    "ratings.dat": lines("1::10::4::100", "1::20::5::101", "1::30::3::102", "2::10::4::200", "2::30::2::201",
                         "2::20::1::202"),
    "movies.dat": lines("10::Toy Story (1995)::Animation|Comedy", "20::Heat (1995)::Action",
                        "30::Fargo (1996)::Crime"),
    "users.dat": lines("1::F::1::10::48067", "2::M::56::16::70072"),
}
ML10M: Files = {
    "ratings.dat": lines("1::10::4.5::100", "1::20::5::101", "1::30::3.5::102", "2::10::4::200", "2::30::2::201",
                         "2::20::0.5::202"),
    "movies.dat": ML1M["movies.dat"],
}
ML20M: Files = {
    "ratings.csv": lines("userId,movieId,rating,timestamp", "1,10,4.0,100", "1,20,5.0,101", "1,30,3.0,102",
                         "2,10,4.0,200", "2,30,2.0,201", "2,20,1.0,202"),
    "movies.csv": lines("movieId,title,genres", '10,"Toy Story, The (1995)",Animation|Comedy',
                        "20,Heat (1995),Action", "30,Fargo (1996),Crime"),
}
RECBOLE: Files = {
    "toy.inter": lines("user_id:token\titem_id:token\trating:float\ttimestamp:float", "1\t10\t4\t100",
                       "1\t20\t5\t101", "1\t30\t3\t102", "2\t10\t4\t200", "2\t30\t2\t201", "2\t20\t1\t202"),
    "toy.item": lines("item_id:token\tmovie_title:token_seq\tprice:float", "10\tToy Story\t9.5", "20\tHeat\t8",
                      "30\tFargo\t7"),
}
S3REC: Files = {
    "Toy.txt": lines("1 10 20 30", "2 10 30 20"),
    "Toy_item2attributes.json": json.dumps({"10": [1], "20": [2], "30": [1, 2]}).encode(),
}
CSV: Files = {
    "log.csv": lines("user_id,item_id,timestamp", "1,10,100", "1,20,101", "1,30,102", "2,10,200", "2,30,201",
                     "2,20,202"),
    "items.csv": lines("item_id,title,genres", "10,Toy Story,Animation|Comedy", "20,Heat,Action", "30,Fargo,Crime"),
}
CSV_ARGS = ("--path", "log.csv", "--items-path", "items.csv")


def parquet(**columns: list[object]) -> bytes:
    sink = io.BytesIO()
    pq.write_table(pa.table(columns), sink)
    return sink.getvalue()


LOG: dict[str, list[object]] = {
    "user_id": ["1", "1", "1", "2", "2", "2"], "item_id": ["10", "20", "30", "10", "30", "20"],
    "timestamp": [100, 101, 102, 200, 201, 202]}
PARQUET = parquet(**LOG)


def log_with(**columns: list[object]) -> bytes:
    """The valid Parquet log with some columns replaced."""
    return parquet(**{**LOG, **columns})


@dataclass(frozen=True)
class Fails:
    file: str  # the file the message names, relative to the dataset folder
    line: int | None
    reason: str  # a regex the rest of the message must match


# What every valid dataset below holds, in time order: user "1", then user "2".
SEQUENCES = (("10", "20", "30"), ("10", "30", "20"))


@dataclass(frozen=True)
class Reads:
    warning: str | None = None  # a regex one logged warning must match (None: no warning at all)
    sequences: tuple[tuple[str, ...], ...] = SEQUENCES


@dataclass(frozen=True)
class Case:
    dataset: str
    name: str
    files: Files
    expect: Fails | Reads
    args: tuple[str, ...] = ()  # --path etc., relative to the folder; default: --path <folder>


def changed(base: Files, **files: bytes | None) -> Files:
    """``base`` with files replaced (a name with a dot is spelled with "__": ``u__data``), or removed (None)."""
    result = dict(base)
    for name, content in files.items():
        name = name.replace("__", ".")
        if content is None:
            result.pop(name)
        else:
            result[name] = content
    return result


def replace(base: Files, name: str, old: bytes, new: bytes) -> Files:
    assert old in base[name], (name, old)
    return {**base, name: base[name].replace(old, new, 1)}


BAD_PRICE = replace(RECBOLE, "toy.item", b"\t7\n", b"\tseven\n")
LATIN1_TITLE = "10::Café (1995)::Drama\n20::Heat (1995)::Action\n30::Fargo (1996)::Crime\n".encode("latin-1")

CASES = [
    # --- MovieLens 100K: tab-separated u.data, '|'-separated u.item / u.user, no header
    Case("ml-100k", "valid", ML100K, Reads()),
    Case("ml-100k", "truncated line", replace(ML100K, "u.data", b"1\t30\t3\t102", b"1\t30\t3"),
         Fails("u.data", 3, r"expected 4 fields separated by '\\t', found 3")),
    Case("ml-100k", "last line cut at a tab", replace(ML100K, "u.data", b"2\t20\t1\t202\n", b"2\t20\t"),
         Fails("u.data", 6, "expected 4 fields .* found 3")),
    Case("ml-100k", "comma separated", changed(ML100K, u__data=ML100K["u.data"].replace(b"\t", b",")),
         Fails("u.data", 1, r"expected 4 fields separated by '\\t', found 1")),
    Case("ml-100k", "not UTF-8", replace(ML100K, "u.data", b"1\t20", b"1\t2\xff0"),
         Fails("u.data", 2, "not valid utf-8 text")),
    Case("ml-100k", "u.user not UTF-8", replace(ML100K, "u.user", b"other", b"oth\xe9r"),
         Fails("u.user", 2, "not valid utf-8 text")),
    Case("ml-100k", "u.item in Latin-1 (as shipped)", replace(ML100K, "u.item", b"Heat", "Hé".encode("latin-1")),
         Reads()),
    Case("ml-100k", "missing column", changed(ML100K, u__data=re.sub(rb"\t\d+\n", b"\n", ML100K["u.data"])),
         Fails("u.data", 1, "expected 4 fields .* found 3")),
    Case("ml-100k", "u.item missing genre flags", replace(ML100K, "u.item", f"|{flags(1)}".encode(), b"|0|1"),
         Fails("u.item", 2, "expected 24 fields")),
    Case("ml-100k", "empty user id", replace(ML100K, "u.data", b"2\t30\t2", b"\t30\t2"),
         Fails("u.data", 5, "column 'user_id' is empty")),
    Case("ml-100k", "timestamp not a number", replace(ML100K, "u.data", b"101", b"10l"),
         Fails("u.data", 2, "column 'timestamp': '10l' is not an int")),
    Case("ml-100k", "empty u.data", changed(ML100K, u__data=b""), Fails("u.data", None, "file is empty")),
    Case("ml-100k", "blank u.data", changed(ML100K, u__data=b"\n \n\n"), Fails("u.data", None, "file is empty")),
    Case("ml-100k", "empty u.item", changed(ML100K, u__item=b""), Fails("u.item", None, "file is empty")),
    Case("ml-100k", "no u.item", changed(ML100K, u__item=None), Fails("u.item", None, "no such file")),
    Case("ml-100k", "duplicate rating rows", changed(ML100K, u__data=ML100K["u.data"] + lines("1\t20\t5\t101")),
         Reads(r"u\.data: dropped 1 duplicate row \(same user, item and timestamp as an earlier row, e\.g\. "
                  r"user '1', item '20' at 101\)$")),
    Case("ml-100k", "same item again later is a repeat", changed(ML100K, u__data=ML100K["u.data"]
                                                                 + lines("1\t20\t5\t150")),
         Reads(sequences=(("10", "20", "30", "20"), SEQUENCES[1]))),
    Case("ml-100k", "item listed twice", changed(ML100K, u__item=ML100K["u.item"]
                                                 + f"20|Heat (1995)|||x|{flags(1)}\n".encode()),
         Fails("u.item", 4, "item_id '20' appears again \\(first on line 2\\)")),
    Case("ml-100k", "user listed twice", changed(ML100K, u__user=ML100K["u.user"] + lines("1|25|M|other|0")),
         Fails("u.user", 3, "user_id '1' appears again \\(first on line 1\\)")),
    Case("ml-100k", "byte-order mark", changed(ML100K, u__data=b"\xef\xbb\xbf" + ML100K["u.data"]), Reads()),
    Case("ml-100k", "CRLF line ends", changed(ML100K, u__data=ML100K["u.data"].replace(b"\n", b"\r\n")), Reads()),

    # --- MovieLens 1M / 10M: '::'-separated .dat files
    Case("ml-1m", "valid", ML1M, Reads()),
    Case("ml-1m", "truncated line", replace(ML1M, "ratings.dat", b"1::30::3::102", b"1::30::3"),
         Fails("ratings.dat", 3, "expected 4 fields separated by '::', found 3")),
    Case("ml-1m", "tab separated", changed(ML1M, ratings__dat=ML1M["ratings.dat"].replace(b"::", b"\t")),
         Fails("ratings.dat", 1, "expected 4 fields separated by '::', found 1")),
    Case("ml-1m", "single colons", changed(ML1M, ratings__dat=ML1M["ratings.dat"].replace(b"::", b":")),
         Fails("ratings.dat", 1, "found 1")),
    Case("ml-1m", "not UTF-8", replace(ML1M, "ratings.dat", b"2::10", b"2::1\x80"),
         Fails("ratings.dat", 4, "not valid utf-8 text")),
    Case("ml-1m", "movies.dat in Latin-1 (as shipped)", changed(ML1M, movies__dat=LATIN1_TITLE), Reads()),
    Case("ml-1m", "users.dat not UTF-8", replace(ML1M, "users.dat", b"70072", b"7\xff072"),
         Fails("users.dat", 2, "not valid utf-8 text")),
    Case("ml-1m", "movies.dat missing genres", replace(ML1M, "movies.dat", b"::Action", b""),
         Fails("movies.dat", 2, "expected 3 fields separated by '::', found 2")),
    Case("ml-1m", "empty ratings.dat", changed(ML1M, ratings__dat=b""), Fails("ratings.dat", None, "file is empty")),
    Case("ml-1m", "empty movies.dat", changed(ML1M, movies__dat=b"\n"), Fails("movies.dat", None, "file is empty")),
    Case("ml-1m", "empty item id", replace(ML1M, "ratings.dat", b"1::20::", b"1::::"),
         Fails("ratings.dat", 2, "column 'item_id' is empty")),
    Case("ml-1m", "duplicate rating rows", changed(ML1M, ratings__dat=lines("2::10::4::200") + ML1M["ratings.dat"]),
         Reads(r"ratings\.dat: dropped 1 duplicate row")),
    Case("ml-1m", "movie listed twice", changed(ML1M, movies__dat=ML1M["movies.dat"] + lines("10::Again::Drama")),
         Fails("movies.dat", 4, "item_id '10' appears again \\(first on line 1\\)")),
    Case("ml-10m", "valid", ML10M, Reads()),
    Case("ml-10m", "rating not a number", replace(ML10M, "ratings.dat", b"4.5", b"4,5"),
         Fails("ratings.dat", 1, "column 'rating': '4,5' is not a float")),
    Case("ml-10m", "truncated line", replace(ML10M, "ratings.dat", b"::0.5::202", b"::0.5"),
         Fails("ratings.dat", 6, "expected 4 fields")),
    Case("ml-10m", "duplicate rating rows", changed(ML10M, ratings__dat=ML10M["ratings.dat"] * 2),
         Reads(r"ratings\.dat: dropped 6 duplicate rows")),

    # --- MovieLens 20M: CSV with a header, quoted titles
    Case("ml-20m", "valid", ML20M, Reads()),
    Case("ml-20m", "truncated line", replace(ML20M, "ratings.csv", b"1,30,3.0,102", b"1,30,3.0"),
         Fails("ratings.csv", 4, "expected 4 fields separated by ',', found 3")),
    Case("ml-20m", "semicolon separated", changed(ML20M, ratings__csv=ML20M["ratings.csv"].replace(b",", b";")),
         Fails("ratings.csv", 1, "no column 'userId' \\(columns: userId;movieId;rating;timestamp\\); "
                                 "one column only: is ',' the separator\\?")),
    Case("ml-20m", "missing column", changed(ML20M, ratings__csv=re.sub(rb",\d+\n", b"\n", ML20M["ratings.csv"])
                                            .replace(b",timestamp", b"")),
         Fails("ratings.csv", 1, "no column 'timestamp' \\(columns: userId, movieId, rating\\)")),
    Case("ml-20m", "not UTF-8", replace(ML20M, "movies.csv", b"Heat", b"H\xe9at"),
         Fails("movies.csv", 3, "not valid utf-8 text")),
    Case("ml-20m", "unclosed quote", replace(ML20M, "movies.csv", b'"Toy Story, The (1995)"',
                                             b'"Toy Story, The (1995)'),
         Fails("movies.csv", 2, "unclosed quote")),
    Case("ml-20m", "header only", changed(ML20M, ratings__csv=lines("userId,movieId,rating,timestamp")),
         Fails("ratings.csv", None, "no data rows")),
    Case("ml-20m", "empty", changed(ML20M, movies__csv=b""), Fails("movies.csv", None, "file is empty")),
    Case("ml-20m", "duplicate rating rows", changed(ML20M, ratings__csv=ML20M["ratings.csv"] + lines("2,20,1.0,202")),
         Reads(r"ratings\.csv: dropped 1 duplicate row")),
    Case("ml-20m", "movie listed twice", changed(ML20M, movies__csv=ML20M["movies.csv"] + lines("30,Fargo,Crime")),
         Fails("movies.csv", 5, "item_id '30' appears again \\(first on line 4\\)")),

    # --- RecBole atomic files: tab-separated, `name:type` header
    Case("recbole", "valid", RECBOLE, Reads()),
    Case("recbole", "truncated line", replace(RECBOLE, "toy.inter", b"1\t30\t3\t102", b"1\t30"),
         Fails("toy.inter", 4, "expected 4 fields separated by '\\\\t', found 2")),
    Case("recbole", "comma separated", changed(RECBOLE, toy__inter=RECBOLE["toy.inter"].replace(b"\t", b",")),
         Fails("toy.inter", 1, "one header field 'user_id:token,item_id:token,.*': fields are separated by tabs")),
    Case("recbole", "not UTF-8", replace(RECBOLE, "toy.inter", b"2\t30", b"2\t3\xc00"),
         Fails("toy.inter", 6, "not valid utf-8 text")),
    Case("recbole", "no item_id field", changed(RECBOLE, toy__inter=RECBOLE["toy.inter"]
                                                .replace(b"item_id:token", b"item:token")),
         Fails("toy.inter", 1, "no 'item_id' field in the header")),
    Case("recbole", "unknown field type", replace(RECBOLE, "toy.inter", b"rating:float", b"rating:number"),
         Fails("toy.inter", 1, "header field 'rating:number' is not name:type")),
    Case("recbole", ".item row short of a field", replace(RECBOLE, "toy.item", b"Heat\t8", b"Heat"),
         Fails("toy.item", 3, "expected 3 fields")),
    Case("recbole", ".item float that is not one", BAD_PRICE,
         Fails("toy.item", 4, "column 'price:float': 'seven' is not a float")),
    Case("recbole", ".item float after blank lines", replace(BAD_PRICE, "toy.item", b"\n20", b"\n\n\n20"),
         Fails("toy.item", 6, "'seven' is not a float")),
    Case("recbole", "empty", changed(RECBOLE, toy__inter=b""), Fails("toy.inter", None, "file is empty")),
    Case("recbole", "header only", changed(RECBOLE, toy__inter=RECBOLE["toy.inter"].split(b"\n")[0] + b"\n"),
         Fails("toy.inter", None, "no data rows")),
    Case("recbole", "duplicate rows", changed(RECBOLE, toy__inter=RECBOLE["toy.inter"] + lines("1\t10\t4\t100")),
         Reads(r"toy\.inter: dropped 1 duplicate row")),
    Case("recbole", "item listed twice", changed(RECBOLE, toy__item=RECBOLE["toy.item"] + lines("10\tAgain\t1")),
         Fails("toy.item", 5, "item_id '10' appears again \\(first on line 2\\)")),
    Case("recbole", ".item field named item_idx", replace(RECBOLE, "toy.item", b"price:float", b"item_idx:float"),
         Fails("", None, "the recbole metadata has a column 'item_idx', a name the prepared folder keeps for its own "
                         "\\(item_idx, item_id\\); rename it")),

    # --- S3-Rec lines: `user item item ...`, no clock
    Case("s3rec", "valid", S3REC, Reads()),
    Case("s3rec", "truncated line (user only)", changed(S3REC, Toy__txt=lines("1 10 20 30", "2")),
         Fails("Toy.txt", 2, "found a user with no items")),
    Case("s3rec", "comma separated", changed(S3REC, Toy__txt=lines("1,10,20,30", "2,10,30,20")),
         Fails("Toy.txt", 1, "expected 'user item \\[item ...\\]' separated by spaces, found '1,10,20,30'")),
    Case("s3rec", "not UTF-8", changed(S3REC, Toy__txt=lines("1 10 20 30") + b"2 1\xfe0 30 20\n"),
         Fails("Toy.txt", 2, "not valid utf-8 text")),
    Case("s3rec", "empty", changed(S3REC, Toy__txt=b""), Fails("Toy.txt", None, "file is empty")),
    Case("s3rec", "user on two lines", changed(S3REC, Toy__txt=S3REC["Toy.txt"] + lines("1 30")),
         Fails("Toy.txt", 3, "user '1' appears again \\(first on line 1\\)")),
    Case("s3rec", "repeated item is a repeat", changed(S3REC, Toy__txt=lines("1 10 20 20 30", "2 10 30 20")),
         Reads(sequences=(("10", "20", "20", "30"), SEQUENCES[1]))),
    Case("s3rec", "old Mac line ends", changed(S3REC, Toy__txt=S3REC["Toy.txt"].replace(b"\n", b"\r")), Reads()),
    Case("s3rec", "byte-order mark", changed(S3REC, Toy__txt=b"\xef\xbb\xbf" + S3REC["Toy.txt"]), Reads()),
    Case("s3rec", "attributes JSON truncated", changed(S3REC, Toy_item2attributes__json=b'{"10": [1],\n "20": [2'),
         Fails("Toy_item2attributes.json", 2, "not valid JSON")),
    Case("s3rec", "attributes JSON not UTF-8", changed(S3REC, Toy_item2attributes__json=b'{"10": [1],\n"\xff": []}'),
         Fails("Toy_item2attributes.json", 2, "not valid utf-8 text")),
    Case("s3rec", "attributes JSON empty", changed(S3REC, Toy_item2attributes__json=b""),
         Fails("Toy_item2attributes.json", None, "file is empty")),
    Case("s3rec", "attributes JSON lists an item twice",
         changed(S3REC, Toy_item2attributes__json=b'{"10": [1],\n "20": [2],\n "10": [3]}'),
         Fails("Toy_item2attributes.json", None, "item '10' appears twice")),

    # --- CSV / TSV with a header line
    Case("csv", "valid", CSV, Reads(), args=CSV_ARGS),
    Case("csv", "truncated line", replace(CSV, "log.csv", b"1,30,102", b"1,30"),
         Fails("log.csv", 4, "expected 3 fields separated by ',', found 2"), args=CSV_ARGS),
    Case("csv", "tab separated, --sep not given", changed(CSV, log__csv=CSV["log.csv"].replace(b",", b"\t")),
         Fails("log.csv", 1, r"no column 'user_id' \(columns: user_id\\titem_id\\ttimestamp\); "
                             r"one column only: is ',' the separator\?"), args=CSV_ARGS),
    Case("csv", "TSV with --sep '\\t'", {name: content.replace(b",", b"\t") for name, content in CSV.items()},
         Reads(), args=(*CSV_ARGS, "--sep", "\\t")),
    Case("csv", "not UTF-8", replace(CSV, "log.csv", b"2,30", b"2,3\x910"),
         Fails("log.csv", 6, "not valid utf-8 text"), args=CSV_ARGS),
    Case("csv", "header not UTF-8", replace(CSV, "log.csv", b"item_id", b"item_\xefd"),
         Fails("log.csv", 1, "header is not valid utf-8 text"), args=CSV_ARGS),
    Case("csv", "missing column", replace(CSV, "log.csv", b"timestamp", b"time"),
         Fails("log.csv", 1, "no column 'timestamp' \\(columns: user_id, item_id, time\\)"), args=CSV_ARGS),
    Case("csv", "empty item id", replace(CSV, "log.csv", b"2,10,", b"2,,"),
         Fails("log.csv", 5, "column 'item_id' is empty"), args=CSV_ARGS),
    Case("csv", "empty timestamp", replace(CSV, "log.csv", b",201", b","),
         Fails("log.csv", 6, "column 'timestamp': '' is neither a number nor an ISO date"), args=CSV_ARGS),
    Case("csv", "bad timestamp", replace(CSV, "log.csv", b",101", b",soon"),
         Fails("log.csv", 3, "column 'timestamp': 'soon' is neither a number nor an ISO date"), args=CSV_ARGS),
    Case("csv", "unclosed quote", replace(CSV, "log.csv", b"1,20,", b'1,"20,'),
         Fails("log.csv", 3, "unclosed quote"), args=CSV_ARGS),
    Case("csv", "empty", changed(CSV, log__csv=b""), Fails("log.csv", None, "file is empty"), args=CSV_ARGS),
    Case("csv", "header only", changed(CSV, log__csv=lines("user_id,item_id,timestamp")),
         Fails("log.csv", None, "no data rows"), args=CSV_ARGS),
    Case("csv", "duplicate rows", changed(CSV, log__csv=CSV["log.csv"] + lines("1,30,102", "1,30,102")),
         Reads(r"log\.csv: dropped 2 duplicate rows"), args=CSV_ARGS),
    Case("csv", "no clock: repeated rows are steps", changed(CSV, log__csv=CSV["log.csv"] + lines("1,30,102")),
         Reads(sequences=(("10", "20", "30", "30"), SEQUENCES[1])), args=(*CSV_ARGS, "--time-col", "")),
    Case("csv", "items file not UTF-8", replace(CSV, "items.csv", b"Heat", b"H\xe9at"),
         Fails("items.csv", 3, "not valid utf-8 text"), args=CSV_ARGS),
    Case("csv", "items file lists an item twice", changed(CSV, items__csv=CSV["items.csv"] + lines("20,Heat 2,Action")),
         Fails("items.csv", 5, "item_id '20' appears again \\(first on line 3\\)"), args=CSV_ARGS),
    Case("csv", "items file without the item column", replace(CSV, "items.csv", b"item_id,", b"id,"),
         Fails("items.csv", 1, "no column 'item_id'"), args=CSV_ARGS),
    Case("csv", "items file with an item_idx column",
         changed(CSV, items__csv=lines("item_id,item_idx", "10,5", "20,6")),
         Fails("items.csv", 1, "column 'item_idx' is a name seqrec prepare keeps for its own items.parquet columns "
                               "\\(item_idx, item_id\\); rename it"), args=CSV_ARGS),
    Case("csv", "items file repeats a column",
         replace(CSV, "items.csv", b"item_id,title,genres", b"item_id,title,title"),
         Fails("items.csv", 1, "column 'title' appears 2 times in the header; rename all but one"), args=CSV_ARGS),
    Case("csv", "timestamps mix numbers and dates", replace(CSV, "log.csv", b",201", b",2020-01-01"),
         Fails("log.csv", 6, "column 'timestamp' mixes numbers and dates: '2020-01-01' here, '100' at line 2; "
                             "write every timestamp the same way"), args=CSV_ARGS),
    Case("csv", "--sep of two characters", CSV,
         Fails("", None, "--sep must be one character other than a line break, got ';;'"),
         args=(*CSV_ARGS, "--sep", ";;")),
    Case("csv", "empty --sep", CSV, Fails("", None, "--sep must be one character .*, got ''"),
         args=(*CSV_ARGS, "--sep", "")),
    Case("csv", "--sep of a lone backslash", CSV,
         Fails("", None, re.escape("--sep '\\\\' holds an incomplete backslash escape")),
         args=(*CSV_ARGS, "--sep", "\\")),
    Case("csv", "--user-col names the item column", CSV,
         Fails("", None, "--user-col and --item-col name the same column 'item_id'; give each its own column"),
         args=(*CSV_ARGS, "--user-col", "item_id")),
    Case("csv", "--time-col names the user column", CSV,
         Fails("", None, "--user-col and --time-col name the same column 'user_id'"),
         args=(*CSV_ARGS, "--time-col", "user_id")),

    # --- Parquet (read by the csv reader): no lines, so rows are named instead
    Case("csv", "parquet: valid", {"log.parquet": PARQUET}, Reads(), args=("--path", "log.parquet")),
    Case("csv", "parquet: not Parquet", {"log.parquet": CSV["log.csv"]},
         Fails("log.parquet", None, "not a readable Parquet file"), args=("--path", "log.parquet")),
    Case("csv", "parquet: truncated", {"log.parquet": PARQUET[: len(PARQUET) // 2]},
         Fails("log.parquet", None, "not a readable Parquet file"), args=("--path", "log.parquet")),
    Case("csv", "parquet: corrupt data pages", {"log.parquet": PARQUET[:4] + b"\x00" * 200 + PARQUET[204:]},
         Fails("log.parquet", None, "not a readable Parquet file"), args=("--path", "log.parquet")),
    Case("csv", "parquet: empty file", {"log.parquet": b""},
         Fails("log.parquet", None, "file is empty"), args=("--path", "log.parquet")),
    Case("csv", "parquet: missing column", {"log.parquet": parquet(user_id=LOG["user_id"], item_id=LOG["item_id"])},
         Fails("log.parquet", None, "no column 'timestamp' \\(columns: user_id, item_id\\)"),
         args=("--path", "log.parquet")),
    Case("csv", "parquet: no rows", {"log.parquet": parquet(user_id=[], item_id=[], timestamp=[])},
         Fails("log.parquet", None, "no data rows"), args=("--path", "log.parquet")),
    Case("csv", "parquet: null user", {"log.parquet": log_with(user_id=["1", "1", None, "2", "2", "2"])},
         Fails("log.parquet", None, "row 3: column 'user_id' has 1 empty value$"),
         args=("--path", "log.parquet")),
    Case("csv", "parquet: empty item", {"log.parquet": log_with(item_id=["10", "", "30", "10", "", "20"])},
         Fails("log.parquet", None, "row 2: column 'item_id' has 2 empty values"),
         args=("--path", "log.parquet")),
    Case("csv", "parquet: NaN item", {"log.parquet": log_with(item_id=[10.0, 20.0, float("nan"), 10.0, 30.0, 20.0])},
         Fails("log.parquet", None, "row 3: column 'item_id' has 1 empty value$"), args=("--path", "log.parquet")),
    Case("csv", "parquet: duplicate rows", {"log.parquet": parquet(**{k: v + v[:2] for k, v in LOG.items()})},
         Reads(r"log\.parquet: dropped 2 duplicate rows"), args=("--path", "log.parquet")),

    # --- synthetic: no files, but its flags are input too
    Case("synthetic", "n_items too small", {}, Fails("", None, "n_items must be >= 2, got 1"),
         args=("--n-items", "1")),
    Case("synthetic", "mean length below the minimum", {}, Fails("", None, "lengths must satisfy"),
         args=("--mean-length", "2")),
]


def _id(case: Case) -> str:
    return f"{case.dataset}: {case.name}"


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_prepare(case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                 caplog: pytest.LogCaptureFixture) -> None:
    folder = tmp_path / "data"
    folder.mkdir()
    for name, content in case.files.items():
        (folder / name).write_bytes(content)
    args = list(case.args)
    if case.dataset != "synthetic" and "--path" not in args:
        args = ["--path", ".", *args]
    for flag in ("--path", "--items-path"):
        if flag in args:
            at = args.index(flag) + 1
            args[at] = str(folder / args[at])
    out = tmp_path / "prepared"
    with caplog.at_level(logging.WARNING):
        code = main(["prepare", "--dataset", case.dataset, *args, "--out", str(out)])
    stdout, stderr = capsys.readouterr()
    assert "Traceback" not in stderr + stdout
    expect = case.expect
    if isinstance(expect, Fails):
        assert code == 1, stdout
        assert stderr.count("\n") == 1, stderr
        where = str(folder / expect.file) if expect.file else ""
        where += f":{expect.line}" if expect.line is not None else ""
        prefix = f"seqrec: error: {where}: " if where else "seqrec: error: "
        assert stderr.startswith(prefix), (prefix, stderr)
        assert re.search(expect.reason, stderr[len(prefix):]), (expect.reason, stderr)
        assert "internal error" not in stderr
        assert not out.exists()
        return
    assert code == 0, stderr
    sequences = pq.read_table(out / "sequences.parquet")
    assert sequences.column("user_id").to_pylist() == ["1", "2"]
    assert tuple(tuple(items) for items in sequences.column("items").to_pylist()) == expect.sequences
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["interactions"] == sum(len(items) for items in expect.sequences)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    if expect.warning is None:
        assert not warnings, warnings
    else:
        assert any(re.search(expect.warning, w) for w in warnings), (expect.warning, warnings)


def test_every_reader_is_covered() -> None:
    from offline.data.readers import READERS

    assert {c.dataset for c in CASES} == set(READERS)
