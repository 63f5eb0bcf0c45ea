"""`seqrec pipeline` and `seqrec demo`: the whole job end to end, from a config or on built-in data."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from common.errors import SeqrecError
from offline.cli.common import Subparsers, set_threads, shipped_configs
from offline.cli.serve import check_bindable, settings_message
from offline.cli.temporal import add_protocol_arguments
from offline.jobs.versions import CURRENT

if TYPE_CHECKING:
    from service.http.settings import Settings


def add_pipeline_parser(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "pipeline", parents=[common], help="prepare, train, mine, train the ranker, evaluate and publish a bundle",
        description="Run the main job end to end from a pipeline config (configs/pipeline/*.yaml): prepare -> "
        "train retriever -> export index -> mine -> train ranker -> evaluate -> publish. Publishing moves the "
        "bundle into ARTIFACTS/versions/<version> and then switches ARTIFACTS/current atomically; a failing "
        "stage never touches current. Prints stage times and the retriever and two-stage metrics.",
        epilog="Roll out to a running service with `curl -X POST localhost:8000/admin/reload` (plus the API key); "
        "`seqrec rollback` switches back.",
    )
    p.add_argument("--config", type=Path, default=os.environ.get("SEQREC_PIPELINE_CONFIG"),
                   help="pipeline YAML (default $SEQREC_PIPELINE_CONFIG)")
    p.add_argument("--out", type=Path, required=True, help="artifacts folder (versions/, current, work/)")
    p.add_argument("--resume", action="store_true",
                   help="continue the newest unfinished run of this config (a new run when there is none)")
    p.add_argument("--keep", type=int, default=None, help="published versions to keep (default: the config's)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for training")
    p.add_argument("--warm-start", action="store_true",
                   help="train from the served bundle's weights (as `warm_start: true` in the config)")
    p.add_argument("--budget-minutes", type=_budget, default=None, metavar="MINUTES",
                   help="publish within MINUTES (+10 %%): plan the stages from a probe of the retriever's costs and "
                   "shrink what does not fit (as `budget_minutes:` in the config, which this replaces)")
    add_protocol_arguments(p, refit=False)
    p.set_defaults(handler=_pipeline, protocol=None)  # None: the config's `split:` section (leave-one-out without)


def _budget(text: str) -> float:
    """argparse type of --budget-minutes: a bad one exits 2 before any work."""
    from offline.jobs.budget import check_budget

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number of minutes, got {text!r}") from None
    try:
        checked = check_budget(value, "--budget-minutes")
    except SeqrecError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    assert checked is not None
    return checked


def _pipeline(args: argparse.Namespace) -> int:
    import sys

    from offline.jobs.budget import BudgetError
    from offline.jobs.pipeline import run_pipeline, summary_table

    if args.config is None:
        raise SeqrecError("--config is required (or set SEQREC_PIPELINE_CONFIG); see configs/pipeline/")
    if not args.config.exists():
        shipped = shipped_configs() / "pipeline"
        names = ", ".join(sorted(p.name for p in shipped.glob("*.yaml")))
        raise SeqrecError(f"{args.config}: no such pipeline config (seqrec ships {names} in {shipped})")
    if args.keep is not None and args.keep < 1:
        raise SeqrecError(f"--keep must be >= 1, got {args.keep}")
    set_threads(args.threads)
    try:
        summary = run_pipeline(args.config, args.out, resume=args.resume, keep=args.keep, threads=args.threads,
                               warm_start=args.warm_start, budget_minutes=args.budget_minutes,
                               split=_split_flags(args))
    except BudgetError as err:  # a budget that cannot be planned: a usage error, as a bad --budget-minutes is
        print(f"seqrec: error: {err}", file=sys.stderr)
        return 2
    print(summary_table(summary))
    return 0


def _split_flags(args: argparse.Namespace) -> dict[str, str]:
    """--protocol, --valid-cut and --test-cut as given, to override the config's `split:` section."""
    given = {"protocol": args.protocol, "valid_cut": args.valid_cut, "test_cut": args.test_cut}
    return {key: value for key, value in given.items() if value is not None}


def add_rollback_parser(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "rollback", parents=[common], help="switch ARTIFACTS/current back to the previously published version",
        description="Point ARTIFACTS/current at the version published before the one it names (or --to VERSION), "
        "atomically and under the pipeline's lock. The catalogue journal lives beside the versions, so retired "
        "items stay retired and added items stay added. Running servers follow within SEQREC_RELOAD_POLL_S; "
        "--reload URL asks one at once (POST /admin/reload, with --api-key or $SEQREC_API_KEY).",
    )
    p.add_argument("--artifacts", type=Path, required=True, help="artifacts folder (versions/, current)")
    p.add_argument("--to", default=None, metavar="VERSION", help="the version to switch to (default: the previous)")
    p.add_argument("--reload", default=None, metavar="URL", help="a server to reload now, e.g. http://127.0.0.1:8000")
    p.add_argument("--api-key", default=os.environ.get("SEQREC_API_KEY") or None,
                   help="the server's API key (default $SEQREC_API_KEY)")
    p.set_defaults(handler=_rollback)


def _rollback(args: argparse.Namespace) -> int:
    from offline.jobs.rollback import ask_reload, rollback

    old, new = rollback(args.artifacts, args.to)
    print(f"current: {old} -> {new}")
    if args.reload:
        answer = ask_reload(args.reload, args.api_key)
        print(f"{args.reload}: {answer.get('status')} ({answer.get('previous_version')} -> "
              f"{answer.get('model_version')})")
    return 0


def add_demo_parser(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "demo", parents=[common], help="the embedded default: run the pipeline on built-in data and serve it",
        description="Run `seqrec pipeline` on the built-in synthetic dataset (or, with --download, MovieLens-100K "
        "from GroupLens), then serve the published bundle with the in-process history store and print a "
        "curl example. Needs no data and no services.",
    )
    p.add_argument("--out", type=Path, default=Path("artifacts/demo"), help="artifacts folder")
    p.add_argument("--download", action="store_true", help="MovieLens-100K from GroupLens instead of synthetic")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--no-serve", action="store_true", help="stop after publishing")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for training")
    p.set_defaults(handler=_demo)


def _demo(args: argparse.Namespace) -> int:
    from offline.jobs.pipeline import run_pipeline, summary_table
    from service.system.loader import load_bundle

    settings = None
    if not args.no_serve:  # before minutes of training, not after
        check_bindable(args.host, args.port, "--host/--port")
        settings = demo_settings(args)
    set_threads(args.threads)
    config = shipped_configs() / "pipeline" / ("ml-100k-download.yaml" if args.download else "demo.yaml")
    summary = run_pipeline(config, args.out, threads=args.threads)
    print(summary_table(summary))
    bundle = load_bundle(args.out / CURRENT)
    history = [bundle.external(int(i)) for i in bundle.popular[:3]]
    body = json.dumps({"history": history, "k": 5})
    print(f"\ntry it:\n  curl -s http://{args.host}:{args.port}/recommend -H 'content-type: application/json' "
          f"-d '{body}'\n  (API docs: http://{args.host}:{args.port}/docs)\n", flush=True)
    if args.no_serve:
        return 0
    from service.http.server import serve_one

    assert settings is not None
    serve_one(settings, bundle)
    return 0


def demo_settings(args: argparse.Namespace) -> Settings:
    """The demo server's settings; on a non-loopback --host without SEQREC_API_KEY, the one-line refusal."""
    from pydantic import ValidationError

    from service.http.settings import Settings

    given = {"host": args.host, "port": args.port}
    try:
        return Settings(artifacts=args.out, redis_url=None, log_level="info", **given)
    except ValidationError as err:
        raise SeqrecError("invalid settings: " + settings_message(err, given)) from None
