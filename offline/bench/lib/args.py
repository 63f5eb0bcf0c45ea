"""What several benches' command lines take: comma-separated integers, models named by their configs, and the
--threads/--device shorthands for config overrides (`seqrec bench`, `seqrec bench latency`, `seqrec bench index`,
`seqrec bench two-stage`)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from common.errors import SeqrecError


@dataclass(frozen=True)
class ModelSpec:
    """One table row: its label (row name and run folder) and the YAML config it trains."""

    label: str
    config: Path


def parse_ints(text: str, flag: str) -> list[int]:
    """``"42,123"`` -> ``[42, 123]``; a SeqrecError naming ``flag`` otherwise."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SeqrecError(f"{flag} must be comma-separated integers, got {text!r}") from None
    if not values:
        raise SeqrecError(f"{flag} is empty")
    return values


def shorthand_overrides(args: argparse.Namespace) -> list[str]:
    """--set, then --threads and --device as the config overrides they stand for."""
    overrides = list(args.set or [])
    for flag, key in (("threads", "train.threads"), ("device", "train.device")):
        if getattr(args, flag) is not None:
            overrides.append(f"{key}={getattr(args, flag)}")
    return overrides


def resolve_models(models: str, configs_dir: Path, dataset: str | None) -> list[ModelSpec]:
    """``"sasrec,path/to/x.yaml"`` -> specs; a bare name means ``configs_dir/<dataset>/<name>.yaml``."""
    specs: list[ModelSpec] = []
    for entry in (m.strip() for m in models.split(",")):
        if not entry:
            continue
        if entry.endswith((".yaml", ".yml")):
            path = Path(entry)
        elif dataset is None:
            raise SeqrecError(f"model {entry!r}: give --dataset-name or --data to find {configs_dir}/<dataset>/"
                              f"{entry}.yaml, or pass a YAML path")
        else:
            path = configs_dir / dataset / f"{entry}.yaml"
        if not path.is_file():
            known = sorted(p.stem for p in path.parent.glob("*.y*ml")) if path.parent.is_dir() else []
            hint = f"; {path.parent} has: {', '.join(known)}" if known else " (see --configs-dir, --dataset-name)"
            raise SeqrecError(f"model {entry!r}: no config {path}{hint}")
        specs.append(ModelSpec(path.stem, path))
    labels = [s.label for s in specs]
    if not specs or len(set(labels)) != len(labels):
        raise SeqrecError(f"--models needs one or more distinct models, got {models!r}")
    return specs
