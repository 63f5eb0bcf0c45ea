"""`seqrec backtest`: retrain at every step, replay the next window through the served system (docs/backtest.md)."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from offline.cli.common import Subparsers, set_threads


def add_backtest_parser(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "backtest", parents=[common], help="retrain every step on the past, replay the next window as served",
        description="At each of --steps steps from --start, train the pipeline config on every interaction before "
        "the step (from scratch, warm-started from the previous step's bundle, or both), publish, and replay the "
        "window [step, step + --step) through the served system: each active user's nightly list, and the live "
        "list before each event as the events arrive. A sample of users is checked over HTTP against a real "
        "server. Writes per-step JSON, a table, a plot and backtest.json under --out; a killed run resumes from "
        "its last finished step when started again with the same arguments.",
    )
    p.add_argument("--config", type=Path, required=True, help="pipeline YAML (configs/pipeline/*.yaml)")
    p.add_argument("--start", required=True, help="time of the first step: ISO date (UTC) or unix seconds")
    p.add_argument("--step", default="1d", help="length of a step: 1d, 7d, 12h, 3600s (default 1d)")
    p.add_argument("--steps", type=int, required=True, help="number of steps")
    p.add_argument("--out", type=Path, required=True, help="output folder (a new one, or a backtest's to resume)")
    p.add_argument("--mode", choices=("scratch", "warm", "both"), default="both",
                   help="train from scratch, warm-start from the previous step's bundle, or both side by side")
    p.add_argument("--budget-minutes", type=float, default=None, help="wall-clock cap on each step's training")
    p.add_argument("--k", type=int, default=10, help="list length (default 10)")
    p.add_argument("--http-sample", type=int, default=20, help="users per step checked over HTTP (default 20)")
    p.add_argument("--seed", type=int, default=0, help="seed of the HTTP sample")
    p.add_argument("--train-seed", type=int, default=None, help="train.seed of every training (default: the config's)")
    p.add_argument("--choose-warm", action="store_true",
                   help="choose the warm-start schedule on the window before --start (offline/backtest/choose.py) "
                   "and use it at every step; the choice and its evidence go to warm-choice.json and backtest.json")
    p.add_argument("--warm-choice", type=Path, default=None,
                   help="use the schedule of another backtest's warm-choice.json (the same choice for every seed)")
    p.add_argument("--report-only", action="store_true",
                   help="write the report of the steps finished under --out (a stopped run), training nothing")
    p.add_argument("--note", action="append", default=[], help="a line for the report (what else was running)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for training")
    p.set_defaults(handler=_backtest)


def _backtest(args: argparse.Namespace) -> int:
    from common.errors import SeqrecError
    from offline.backtest.report import write_report
    from offline.backtest.run import Plan, run_backtest
    from offline.backtest.timeline import parse_start, parse_step

    if args.report_only:
        return _report_only(args.out, args.note)
    if args.k < 1 or args.http_sample < 0:
        raise SeqrecError("--k must be >= 1 and --http-sample >= 0")
    if not args.config.is_file():
        raise SeqrecError(f"{args.config}: no such pipeline config")
    if args.choose_warm and args.warm_choice is not None:
        raise SeqrecError("give --choose-warm or --warm-choice, not both")
    warm_overrides = None
    if args.warm_choice is not None:
        if not args.warm_choice.is_file():
            raise SeqrecError(f"--warm-choice {args.warm_choice}: no such file")
        warm_overrides = json.loads(args.warm_choice.read_text()).get("overrides")
        if not isinstance(warm_overrides, dict):
            raise SeqrecError(f"--warm-choice {args.warm_choice}: no 'overrides' object (a warm-choice.json)")
    set_threads(args.threads)
    plan = Plan(config=str(args.config.resolve()), start=parse_start(args.start), step=parse_step(args.step),
                steps=args.steps, mode=args.mode, budget_minutes=args.budget_minutes, k=args.k,
                http_sample=args.http_sample, seed=args.seed, train_seed=args.train_seed,
                choose_warm=args.choose_warm, warm_overrides=warm_overrides)
    records = run_backtest(plan, args.out, threads=args.threads)
    print(write_report(records, args.out, asdict(plan), args.note))
    differ = sum(r["http"]["differ"] for r in records)
    if differ:
        print(f"HTTP parity: {differ} lists differ from the replayed ones")
    return 1 if differ else 0


def _report_only(out: Path, notes: list[str]) -> int:
    """The report of a stopped backtest: its plan and the steps it finished, said so in the notes."""
    from common.errors import SeqrecError
    from offline.backtest.report import write_report

    if not (out / "plan.json").is_file():
        raise SeqrecError(f"{out}: no plan.json, so no backtest's folder to report on")
    plan = json.loads((out / "plan.json").read_text())
    records = [json.loads(p.read_text()) for p in sorted((out / "steps").glob("*.json"))]
    if not records:
        raise SeqrecError(f"{out}: no finished step to report on")
    finished = len({r["step"] for r in records})
    stopped = [] if finished >= plan["steps"] else [f"stopped after {len(records)} step runs: steps 1-{finished} "
                                                    f"of {plan['steps']} (the rest not run)"]
    print(write_report(records, out, plan, [*notes, *stopped]))
    return 0
