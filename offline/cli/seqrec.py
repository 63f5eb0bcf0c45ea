"""The `seqrec` program: the parser built from every command group, and `main`'s error handling.

Every subcommand has --help. Mistakes the user can fix (missing files, unknown columns,
malformed lines) print one line naming the file and line and exit non-zero; a traceback
appears only with --debug.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from typing import TypeGuard

from common import seqrec_version
from common.errors import SeqrecError
from offline.cli.analyze import add_analyze_parser
from offline.cli.backtest import add_backtest_parser
from offline.cli.common import Handler, Subparsers, common_parser, configure_logging
from offline.cli.data import add_prepare_parser
from offline.cli.pipeline import add_demo_parser, add_pipeline_parser, add_rollback_parser
from offline.cli.rank import add_mine_parser, add_train_ranker_parser
from offline.cli.recommend import add_recommend_parser
from offline.cli.reference import add_reference_epilogs
from offline.cli.serve import add_serve_parser
from offline.cli.train import add_evaluate_parser, add_export_parser, add_train_parser
from offline.cli.tune import add_tune_parser


def _add_bench(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    from offline.cli.bench import add_bench_parser  # light at import: torch loads only when a bench runs

    add_bench_parser(sub, common)


# In the order `seqrec --help` lists them: the job's flow, then serving, benches and analysis.
COMMANDS: tuple[Callable[[Subparsers, argparse.ArgumentParser], None], ...] = (
    add_prepare_parser, add_train_parser, add_tune_parser, add_export_parser, add_evaluate_parser, add_mine_parser,
    add_train_ranker_parser, add_pipeline_parser, add_rollback_parser, add_demo_parser, add_serve_parser,
    add_recommend_parser, add_backtest_parser, _add_bench,
    add_analyze_parser,
)


def build_parser() -> argparse.ArgumentParser:
    common = common_parser()
    parser = argparse.ArgumentParser(
        prog="seqrec", parents=[common],
        description="seqrec: a two-stage sequential recommender (prepare data, train, evaluate, serve).",
    )
    parser.add_argument("--version", action="version", version=f"seqrec {seqrec_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in COMMANDS:
        add(sub, common)
    add_reference_epilogs(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The `seqrec` command on ``argv`` (default: this process's arguments); returns its exit status.

    As the program itself (no ``argv``) in a torchrun worker, it does not return: once the command is done
    (every artifact written, the process group destroyed) the worker leaves without the interpreter's teardown.
    There, gloo's native threads have aborted finished workers ("terminate called without an active exception",
    exit -6): once a clean-clone CI run of `torchrun ... train --distributed` failed that way after its artifact
    was written, and twice another torchrun worker of the tests.
    """
    if argv is None:  # the program itself: a SIGTERM (kill, a scheduler, docker stop) unwinds as Ctrl-C does
        _terminate_by_unwinding()
    code = _run(argv)
    if argv is None and "RANK" in os.environ:
        from retriever.distributed import Distributed

        if Distributed.from_env() is not None:
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    return code


class Terminated(BaseException):
    """Raised by SIGTERM, so that every `finally` and cleanup runs: killed outright, `seqrec prepare` left its
    hidden staging folder beside --out, one more each time."""


def _terminate_by_unwinding() -> None:
    def raise_terminated(signum: int, frame: object) -> None:
        raise Terminated

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, raise_terminated)


def _run(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "overrides", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    debug = getattr(args, "debug", False)
    level = logging.DEBUG if debug else logging.WARNING if getattr(args, "quiet", False) else logging.INFO
    configure_logging(level, debug=debug)
    handler: Handler = args.handler
    try:
        if getattr(args, "overrides", False):
            from retriever.config import parse_cli_overrides

            args.extra = parse_cli_overrides(extra)
        return handler(args)
    except KeyboardInterrupt:
        print("seqrec: interrupted", file=sys.stderr)
        return 130
    except Terminated:
        print("seqrec: terminated", file=sys.stderr)
        return 128 + signal.SIGTERM
    except BrokenPipeError:  # `seqrec ... | head`: the reader went away; nothing to report
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as err:
        if debug:
            raise
        if _file_system_error(err):  # a folder that cannot be written, a full disk: the user's to fix
            blocker = _file_in_the_way(err)
            where = blocker or (f"{err.filename}" if err.filename is not None else "")
            reason = "a file, where a folder is needed" if blocker else err.strerror
            print(f"seqrec: error: {where}{': ' if where else ''}{reason}", file=sys.stderr)
            return 1
        user_error = isinstance(err, SeqrecError)
        kind = "error" if user_error else f"internal error ({type(err).__name__})"
        hint = "" if user_error else " (rerun with --debug for the traceback)"
        print(f"seqrec: {kind}: {err}{hint}", file=sys.stderr)
        return int(getattr(err, "exit_code", 1)) if user_error else 1


def _file_system_error(err: Exception) -> TypeGuard[OSError]:
    """An OSError about a path the user gave or about the disk (permissions, read-only, full, not a folder)."""
    if not isinstance(err, OSError) or err.strerror is None:
        return False
    disk = err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS)
    path = err.filename is not None and err.errno in (errno.ENOENT, errno.EACCES, errno.EPERM, errno.ENOTDIR,
                                                      errno.EISDIR, errno.EEXIST)
    return disk or path


def _file_in_the_way(err: OSError) -> str | None:
    """The file that stands where a folder of ``err.filename``'s path has to be, if that is what went wrong."""
    if err.errno not in (errno.EEXIST, errno.ENOTDIR) or err.filename is None:
        return None
    path = os.path.abspath(str(err.filename))
    while path != os.path.dirname(path):
        if os.path.isfile(path):
            return path
        path = os.path.dirname(path)
    return None
