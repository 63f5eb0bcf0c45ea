"""`seqrec tune`: search a retriever config with Optuna on validation; the best one as YAML."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

from common.folders import refuse_seqrec_folder
from offline.cli.common import SEED, Subparsers, at_least, print_json
from offline.cli.temporal import add_protocol_arguments, protocol_from


def add_tune_parser(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "tune", parents=[common], help="search a retriever config on validation (Optuna) and write the best",
        description="Start from --config (with any --section.key value overrides), draw configs from the "
        "backbone family's declared search space (d_model, layers, heads, dropout, lr, batch size, loss, "
        "max_len, item features on/off, schedule; offline/tune/space.py) with a seeded TPE sampler, train "
        "each, and prune trials whose validation NDCG@10 falls below the median at the same epoch. The study "
        "is kept in OUT/study.db: rerunning the command continues it up to --trials finished trials. Writes "
        "OUT/best.yaml (for `seqrec train --config`), OUT/trials.{md,csv}, OUT/history.png and OUT/result.json. "
        "Test is read once, after the search, for the best trial only.",
    )
    p.add_argument("--config", type=Path, default=None, help="base run config YAML (default: built-in defaults)")
    p.add_argument("--data", type=Path, required=True, help="prepared folder (from `seqrec prepare`)")
    p.add_argument("--out", type=Path, required=True, help="folder for the study, the trials and the best config")
    p.add_argument("--trials", type=int, default=None, help="finished trials the study should hold")
    p.add_argument("--budget-minutes", type=at_least(0, float, strict=True), default=None,
                   help="stop the search after this many minutes")
    p.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                   help="what --budget-minutes counts: wall-clock, or this process's CPU time (shared machines)")
    p.add_argument("--seed", type=SEED, default=0, help="the TPE sampler's seed (training seeds stay the config's)")
    p.add_argument("--storage", default=None, help="Optuna RDB URL (default: sqlite:///OUT/study.db)")
    p.add_argument("--fix", action="append", default=[], metavar="PARAM=VALUE",
                   help="pin a searched parameter (repeatable), e.g. --fix d_model=64 --fix schedule=wsd")
    p.add_argument("--threads", type=int, default=None, help="shorthand for --train.threads (CPU)")
    add_protocol_arguments(p, refit=False)
    p.set_defaults(handler=_tune, overrides=True)


def _tune(args: argparse.Namespace) -> int:
    from offline.data.prepared import load_prepared
    from offline.tune.study import TuneOptions, tune
    from retriever.config import apply_overrides, read_yaml

    temporal = protocol_from(args)  # temporal: trials train before the validation cut, scored on its window
    options = TuneOptions(trials=args.trials, budget_minutes=args.budget_minutes, clock=args.clock, seed=args.seed,
                          storage=args.storage, fixed=_pins(args.fix))
    options.check()
    refuse_seqrec_folder(args.out)
    overrides = list(args.extra) + ([f"train.threads={args.threads}"] if args.threads is not None else [])
    base = apply_overrides(read_yaml(args.config, "config file") if args.config else {}, overrides)
    command = "seqrec " + " ".join(shlex.quote(a) for a in sys.argv[sys.argv.index("tune"):]) \
        if "tune" in sys.argv else "seqrec tune"
    data = load_prepared(args.data)
    if temporal is not None:
        temporal.split_data(data)  # data without timestamps, or cuts that leave a window empty: refused now
    result = tune(base, data, args.out, options, command=command, temporal=temporal)
    print_json({k: result[k] for k in ("trials", "best_trial", "best_params", "valid", "test", "budget")})
    return 0


def _pins(items: list[str]) -> dict[str, Any]:
    """``["d_model=64", "schedule=wsd"]`` -> {"d_model": 64, "schedule": "wsd"} (values parsed as YAML)."""
    import yaml

    from common.errors import SeqrecError

    pins: dict[str, Any] = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not name:
            raise SeqrecError(f"--fix {item!r} must look like PARAM=VALUE (e.g. d_model=64)")
        pins[name] = yaml.safe_load(text)
    return pins
