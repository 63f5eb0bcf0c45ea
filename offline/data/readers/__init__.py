"""Dataset readers. Each returns a RawDataset; `seqrec prepare` turns it into the
prepared folder that everything downstream reads."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, get_args, get_type_hints

from common.errors import SeqrecError
from offline.data.readers.base import RawDataset, drop_duplicate_interactions


def _option(help: str | None = None) -> dict[str, Any]:
    """The metadata that makes a `ReaderOptions` field a `seqrec prepare` flag and a key of a pipeline's
    `data.reader`."""
    return {"reader_option": True, "help": help}


@dataclass(frozen=True)
class ReaderOptions:
    """What a reader may need beyond a path; each reader uses its own fields. The fields with `_option` metadata
    are declared here alone: READER_OPTIONS, the `seqrec prepare` flags and the pipeline config's `data.reader`
    keys derive from them."""

    path: Path | None = None
    user_col: str = field(default="user_id", metadata=_option())
    item_col: str = field(default="item_id", metadata=_option())
    time_col: str | None = field(default="timestamp",
                                 metadata=_option("'' when the file has no clock (row order = time)"))
    sep: str = field(default=",", metadata=_option("field separator of CSV files (use '\\t' for TSV)"))
    items_path: Path | None = field(default=None, metadata=_option("optional item metadata file"))
    synthetic: dict[str, Any] | None = None


@dataclass(frozen=True)
class ReaderOption:
    """One reader option: its `ReaderOptions` field, its type (str or Path), whether it may be None (null in a
    pipeline config), its default and its help (the `seqrec prepare` flag's)."""

    name: str
    kind: type
    nullable: bool
    default: Any
    help: str | None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


def _reader_options() -> tuple[ReaderOption, ...]:
    hints = get_type_hints(ReaderOptions)
    options = []
    for f in fields(ReaderOptions):
        if f.metadata.get("reader_option"):
            types = get_args(hints[f.name]) or (hints[f.name],)
            kind = next(t for t in types if t is not type(None))
            options.append(ReaderOption(f.name, kind, type(None) in types, f.default, f.metadata["help"]))
    return tuple(options)


READER_OPTIONS = _reader_options()


def _movielens(variant: str) -> Callable[[ReaderOptions], RawDataset]:
    def read(options: ReaderOptions) -> RawDataset:
        from offline.data.readers.movielens import read_movielens

        return read_movielens(_required_path(options), variant)

    return read


def _s3rec(options: ReaderOptions) -> RawDataset:
    from offline.data.readers.s3rec import read_s3rec

    return read_s3rec(_required_path(options))


def _recbole(options: ReaderOptions) -> RawDataset:
    from offline.data.readers.recbole import read_recbole

    return read_recbole(_required_path(options))


def _tabular(options: ReaderOptions) -> RawDataset:
    from offline.data.readers.tabular import read_tabular

    return read_tabular(
        _required_path(options), user_col=options.user_col, item_col=options.item_col,
        time_col=options.time_col, sep=options.sep, items_path=options.items_path,
    )


def _synthetic(options: ReaderOptions) -> RawDataset:
    from offline.data.readers.synthetic import SyntheticConfig, generate

    try:
        config = SyntheticConfig(**(options.synthetic or {}))
    except ValueError as err:
        raise SeqrecError(f"synthetic data: {err}") from None
    return generate(config)


def _required_path(options: ReaderOptions) -> Path:
    if options.path is None:
        raise SeqrecError("this dataset needs --path (or --download for MovieLens)")
    return options.path


READERS: dict[str, Callable[[ReaderOptions], RawDataset]] = {
    "ml-100k": _movielens("ml-100k"),
    "ml-1m": _movielens("ml-1m"),
    "ml-10m": _movielens("ml-10m"),
    "ml-20m": _movielens("ml-20m"),
    "s3rec": _s3rec,
    "recbole": _recbole,
    "csv": _tabular,
    "synthetic": _synthetic,
}
MOVIELENS = ("ml-100k", "ml-1m", "ml-10m", "ml-20m")


def check_dataset(name: str) -> None:
    """A one-line error naming the readers when ``name`` is none of them."""
    if name not in READERS:
        raise SeqrecError(f"unknown dataset {name!r}; choose from {', '.join(READERS)}")


def read_dataset(name: str, options: ReaderOptions) -> RawDataset:
    """Read ``name``; rows of a file that repeat an earlier row's user, item and timestamp are dropped and
    counted in a warning (see `drop_duplicate_interactions`); generated data is taken as generated."""
    check_dataset(name)
    raw = READERS[name](options)
    return drop_duplicate_interactions(raw) if raw.files else raw
