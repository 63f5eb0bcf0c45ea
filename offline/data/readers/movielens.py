"""MovieLens 100K, 1M, 10M and 20M, read from the files GroupLens ships.

GroupLens does not allow redistribution, so the project ships none of these files:
users fetch them with ``download_movielens`` (checked against the MD5s below) or by
hand from https://grouplens.org/datasets/movielens/.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from common.errors import SeqrecError
from offline.data.errors import DataError
from offline.data.readers.base import ITEM, TIME, USER, RawDataset
from offline.data.readers.recbole import read_recbole
from offline.data.readers.textio import check_unique, read_bytes, read_delimited, row_line

OFFICIAL_BASE_URL = "https://files.grouplens.org/datasets/movielens"


@dataclass(frozen=True)
class Release:
    """One official archive, ``<OFFICIAL_BASE_URL>/<variant>.zip``."""

    variant: str
    md5: str
    folder: str  # the subfolder the zip unpacks to

    @property
    def url(self) -> str:
        return f"{OFFICIAL_BASE_URL}/{self.variant}.zip"


# MD5s as published by GroupLens next to each archive.
RELEASES: dict[str, Release] = {
    release.variant: release
    for release in (
        Release("ml-100k", "0e33842e24a9c977be4e0107933c0723", "ml-100k"),
        Release("ml-1m", "c4d9eecfca2ab87c1945afe126590906", "ml-1m"),
        Release("ml-10m", "ce571fd55effeba0271552578f2648bd", "ml-10M100K"),
        Release("ml-20m", "cd245b17a1ae2cc31bb14903e1204af3", "ml-20m"),
    )
}

# u.item's genre flag columns, in order, when the folder has no u.genre.
ML100K_GENRES = (
    "unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime", "Documentary", "Drama",
    "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery", "Romance", "Sci-Fi", "Thriller", "War", "Western",
)  # fmt: skip

# Placeholders that mean "no genre"; they become an empty list.
_NO_GENRE = frozenset({"unknown", "(no genres listed)"})
_TITLE_YEAR = re.compile(r"\((\d{4})\)\s*$")
_DATE_YEAR = re.compile(r"(\d{4})\s*$")
RATING = "rating"
_RATING_NAMES = [USER, ITEM, RATING, TIME]
_RATING_TYPES = {RATING: pa.float64(), TIME: pa.int64()}
_USER_TYPES = {"age": pa.int32()}
# Ids lose surrounding spaces ("1:: 20::5" is item "20", as Arrow reads the rating beside it as 5): GroupLens
# files have none, and a hand-edited file means none.
_IDS = (USER, ITEM)


def release(variant: str) -> Release:
    """The official archive of a variant; SeqrecError naming the known ones if unknown."""
    if variant not in RELEASES:
        raise SeqrecError(f"unknown MovieLens variant {variant!r} (known: {', '.join(RELEASES)})")
    return RELEASES[variant]


def read_movielens(path: str | Path, variant: str) -> RawDataset:
    """Read a MovieLens variant from its folder, or from a parent holding the zip's subfolder.

    The layout is found from the files present, whatever the variant: ``u.data`` (100K),
    ``ratings.dat`` (1M, 10M), ``ratings.csv`` (20M) or RecBole's ``*.inter``. Interactions
    keep the file order. Items carry ``title`` as in the file, ``year`` (from a trailing
    "(YYYY)", for 100K else the release date; null if neither) and ``genres`` (a list,
    empty for "unknown" / "(no genres listed)"). Users come from ``u.user`` / ``users.dat``.
    """
    info = release(variant)
    root = Path(path)
    if not root.is_dir():
        raise DataError(root, "no such folder")
    for folder in (root, root / info.folder):
        for pattern, reader in _LAYOUTS:
            if folder.is_dir() and any(folder.glob(pattern)):
                return reader(folder, variant)
    looked = ", ".join(pattern for pattern, _ in _LAYOUTS)
    raise DataError(root, f"no MovieLens files here or in {info.folder}/ (looked for {looked})")


def _read_100k(folder: Path, variant: str) -> RawDataset:
    ratings = folder / "u.data"
    interactions = read_delimited(ratings, sep="\t", names=_RATING_NAMES, types=_RATING_TYPES, non_empty=_IDS,
                                  trimmed=_IDS)
    _check_finite_ratings(ratings, interactions, header=False)
    genre_path = folder / "u.genre"
    genres = _read_genre_names(genre_path) if genre_path.exists() else list(ML100K_GENRES)
    items_path = folder / "u.item"
    users_path = folder / "u.user"
    users = _read_users(users_path, sep="|", names=[USER, "age", "gender", "occupation", "zip_code"])
    return RawDataset(
        source=variant,
        interactions=_interaction_columns(interactions),
        items=_read_100k_items(items_path, genres),
        users=users,
        files=[p for p in (ratings, items_path, genre_path, users_path) if p.exists()],
    )


def _read_users(path: Path, *, sep: str, names: list[str]) -> pa.Table | None:
    """The optional users file (100K's u.user, 1M's users.dat): one row per user id, or None if absent."""
    if not path.exists():
        return None
    users = read_delimited(path, sep=sep, names=names, types=_USER_TYPES, trimmed=[USER])
    check_unique(users[USER], path, USER, header=False)
    return users


def _read_genre_names(path: Path) -> list[str]:
    table = read_delimited(path, sep="|", names=["name", "index"], types={"index": pa.int32()})
    by_index = dict(zip(table["index"].to_pylist(), table["name"].to_pylist(), strict=True))
    if sorted(by_index) != list(range(table.num_rows)):
        raise DataError(path, f"genre indices are not 0..{table.num_rows - 1}")
    return [by_index[index] for index in range(table.num_rows)]


def _read_100k_items(path: Path, genres: list[str]) -> pa.Table:
    """u.item: id|title|release date|video release date|IMDb URL|one 0/1 flag per genre."""
    flags = [f"genre_{index}" for index in range(len(genres))]
    table = read_delimited(
        path,
        sep="|",
        names=[ITEM, "title", "release_date", "video_release_date", "imdb_url", *flags],
        types={flag: pa.int8() for flag in flags},
        encoding=_text_encoding(path),
        columns=[ITEM, "title", "release_date", *flags],
        trimmed=[ITEM],
    )
    check_unique(table[ITEM], path, ITEM, header=False)
    rows = zip(*(table[flag].to_pylist() for flag in flags), strict=True)
    genre_lists = [[g for g, on in zip(genres, row, strict=True) if on and g not in _NO_GENRE] for row in rows]
    titles_dates = zip(table["title"].to_pylist(), table["release_date"].to_pylist(), strict=True)
    years = [_year(_TITLE_YEAR, title) or _year(_DATE_YEAR, date) for title, date in titles_dates]
    return _items_table(table[ITEM], table["title"], years, genre_lists)


def _read_dat(folder: Path, variant: str) -> RawDataset:
    """1M and 10M: ratings.dat, movies.dat (``id::title::A|B``) and, for 1M, users.dat."""
    ratings = folder / "ratings.dat"
    interactions = read_delimited(ratings, sep="::", names=_RATING_NAMES, types=_RATING_TYPES, non_empty=_IDS,
                                  trimmed=_IDS)
    _check_finite_ratings(ratings, interactions, header=False)
    movies = folder / "movies.dat"
    items = read_delimited(movies, sep="::", names=[ITEM, "title", "genres"], encoding=_text_encoding(movies),
                           trimmed=[ITEM])
    check_unique(items[ITEM], movies, ITEM, header=False)
    users_path = folder / "users.dat"
    users = _read_users(users_path, sep="::", names=[USER, "gender", "age", "occupation", "zip_code"])
    return RawDataset(
        source=variant,
        interactions=_interaction_columns(interactions),
        items=_split_genres(items),
        users=users,
        files=[p for p in (ratings, movies, users_path) if p.exists()],
    )


def _read_csv(folder: Path, variant: str) -> RawDataset:
    """20M: ratings.csv and movies.csv, each with a header; titles may be quoted."""
    ratings = folder / "ratings.csv"
    interactions = read_delimited(
        ratings,
        sep=",",
        header=True,
        types={RATING: pa.float64(), "timestamp": pa.int64()},
        columns=["userId", "movieId", RATING, "timestamp"],
        non_empty=["userId", "movieId"],
        trimmed=["userId", "movieId"],
    ).rename_columns(_RATING_NAMES)
    _check_finite_ratings(ratings, interactions, header=True)
    movies = folder / "movies.csv"
    items = read_delimited(movies, sep=",", header=True, quoted=True, columns=["movieId", "title", "genres"],
                           trimmed=["movieId"])
    check_unique(items["movieId"], movies, ITEM, header=True, quoted=True)
    return RawDataset(
        source=variant,
        interactions=_interaction_columns(interactions),
        items=_split_genres(items.rename_columns([ITEM, "title", "genres"])),
        files=[ratings, movies],
    )


def _read_recbole_copy(folder: Path, variant: str) -> RawDataset:
    """RecBole's conversion (``ml-100k.inter`` ...), tidied to match the raw files."""
    name = variant if (folder / f"{variant}.inter").is_file() else None
    dataset = read_recbole(folder, name)
    items, users = dataset.items, dataset.users
    if items is not None and "genres" in items.column_names:
        genres = [[g for g in row if g not in _NO_GENRE] for row in items["genres"].to_pylist()]
        items = items.set_column(items.column_names.index("genres"), "genres", pa.array(genres, pa.list_(pa.string())))
    if items is not None and {"title", "year"} <= set(items.column_names):
        # RecBole took the year from the title's last brackets; "... (1995) (V)" got "V".
        pairs = zip(items["year"].to_pylist(), items["title"].to_pylist(), strict=True)
        years = [year if year is not None else _year(_TITLE_YEAR, title) for year, title in pairs]
        items = items.set_column(items.column_names.index("year"), "year", pa.array(years, pa.int32()))
    if users is not None and "age" in users.column_names and pa.types.is_string(users.schema.field("age").type):
        with contextlib.suppress(pa.ArrowInvalid):  # ages that are not all numbers stay text
            users = users.set_column(users.column_names.index("age"), "age", users["age"].cast(pa.int32()))
    return dataclasses.replace(dataset, source=variant, items=items, users=users)


def _check_finite_ratings(path: Path, table: pa.Table, *, header: bool) -> None:
    """NaN or an infinity is no rating: --min-rating would drop it without a word."""
    finite = np.isfinite(table.column(RATING).to_numpy())
    if not finite.all():
        row = int(np.argmin(finite))
        raise DataError(path, f"column {RATING!r} holds a non-finite rating ({table.column(RATING)[row].as_py()})",
                        line=row_line(path, row, header=header))


def _interaction_columns(table: pa.Table) -> pa.Table:
    return table.select([USER, ITEM, TIME, RATING])


def _split_genres(table: pa.Table) -> pa.Table:
    """``id, title, "A|B"`` -> items with a year parsed from the title and a genre list."""
    titles = table["title"].to_pylist()
    genres = [[g for g in text.split("|") if g and g not in _NO_GENRE] for text in table["genres"].to_pylist()]
    return _items_table(table[ITEM], table["title"], [_year(_TITLE_YEAR, t) for t in titles], genres)


def _items_table(
    ids: pa.ChunkedArray, titles: pa.ChunkedArray, years: list[int | None], genres: list[list[str]]
) -> pa.Table:
    return pa.table(
        {
            ITEM: ids,
            "title": titles,
            "year": pa.array(years, pa.int32()),
            "genres": pa.array(genres, pa.list_(pa.string())),
        }
    )


def _year(pattern: re.Pattern[str], text: str) -> int | None:
    match = pattern.search(text)
    return int(match.group(1)) if match else None


def _text_encoding(path: Path) -> str:
    """UTF-8 when the file decodes as such, else ISO-8859-1 (1M's movies.dat, 100K's u.item)."""
    try:
        read_bytes(path).decode("utf-8")
    except UnicodeDecodeError:
        return "iso-8859-1"
    return "utf-8"


_LAYOUTS: tuple[tuple[str, Callable[[Path, str], RawDataset]], ...] = (
    ("u.data", _read_100k),
    ("ratings.dat", _read_dat),
    ("ratings.csv", _read_csv),
    ("*.inter", _read_recbole_copy),
)
