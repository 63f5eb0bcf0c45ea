"""What every command group shares: the --debug/--quiet parent parser, --threads, --ks, JSON output."""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common.errors import SeqrecError

Handler = Callable[[argparse.Namespace], int]
Subparsers = argparse._SubParsersAction
LOG_FORMAT = "%(levelname)s %(name)s: %(message)s"


def shipped_configs() -> Path:
    """The committed configs/: inside an installed wheel at offline/configs (setup.py ships it there), else at
    the root of the source checkout this module runs from."""
    offline = Path(__file__).resolve().parents[1]
    installed = offline / "configs"
    return installed if installed.is_dir() else offline.parent / "configs"


def default_configs_dir() -> Path:
    """Where `<dataset>/<model>.yaml` are looked up by default: ./configs when the working folder has one
    (a checkout, or the user's own), else the configs seqrec ships."""
    return Path("configs") if Path("configs").is_dir() else shipped_configs()


def common_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show full tracebacks and debug logs")
    common.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                        help="only warnings and errors on stderr")
    return common


def configure_logging(level: int | str, *, debug: bool = False, fmt: str = LOG_FORMAT) -> None:
    """Log to stderr at ``level``; faiss's loader lines only with ``debug``.

    faiss logs each SIMD build it fails to load as a ModuleNotFoundError at INFO: noise that reads like a fault.
    """
    logging.basicConfig(level=level, format=fmt, stream=sys.stderr)
    if not debug:
        logging.getLogger("faiss.loader").setLevel(logging.WARNING)


def set_threads(n: int | None) -> None:
    if n is not None:
        if n < 1:
            raise SeqrecError(f"--threads must be >= 1, got {n}")
        import torch
        from threadpoolctl import threadpool_limits

        torch.set_num_threads(n)
        threadpool_limits(n, user_api="blas")  # numpy's BLAS (the ranker's features), which defaults to every core


def at_least(low: float, kind: Callable[[str], Any] = int, *, strict: bool = False,
             most: float | None = None) -> Callable[[str], Any]:
    """An argparse type: ``kind(text)`` that is >= ``low`` (> with ``strict``) and <= ``most``, and finite (nan
    compares false both ways, so it passed every bound); argparse names the flag."""
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"not a finite number: {text!r}")
        if value < low or (strict and value == low):
            raise argparse.ArgumentTypeError(f"must be {'>' if strict else '>='} {low}, got {text}")
        if most is not None and value > most:
            raise argparse.ArgumentTypeError(f"must be <= {most}, got {text}")
        return value

    return parse


def file_path(text: str) -> Path:
    """An argparse type for a file to write: a path ending in a separator names a folder (Path drops the slash,
    and a file of the folder's name was written)."""
    if text.endswith(("/", os.sep)):
        raise argparse.ArgumentTypeError(f"{text!r} names a folder; give a file name, e.g. {text}recs.parquet")
    return Path(text)


SEED = at_least(0, most=2**32 - 1)  # an argparse type: what numpy, torch and Optuna all take as a seed


def parse_names(text: str) -> tuple[str, ...]:
    """A comma-separated list of names ("" = none)."""
    return tuple(name.strip() for name in text.split(",") if name.strip())


MAX_K = 2**31 - 1  # a cut-off numpy's rank arithmetic takes on any platform (a larger one overflowed)


def parse_ks(text: str) -> tuple[int, ...]:
    try:
        ks = tuple(int(k) for k in text.split(","))
    except ValueError:
        raise SeqrecError(f"--ks must be comma-separated integers, got {text!r}") from None
    if not ks or min(ks) < 1:
        raise SeqrecError("--ks values must be >= 1")
    if max(ks) > MAX_K:
        raise SeqrecError(f"--ks values must be at most {MAX_K:,}, got {max(ks)}")
    return ks


def print_json(result: dict[str, Any]) -> None:
    """A command's result on stdout, as every command that reports JSON prints it."""
    print(json.dumps(result, indent=2))
