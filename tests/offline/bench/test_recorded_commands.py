"""The commands the warm-start result files record parse again: their notes were joined unquoted (`--note ML-100K,
configs/...`), which the bench's own parser refused (`unrecognized arguments`)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from offline.bench import warm_start

RESULTS = Path(__file__).resolve().parents[3] / "docs" / "results" / "warm-start"


@pytest.mark.parametrize("record", sorted(RESULTS.rglob("results.json")), ids=lambda p: str(p.parent.name))
def test_a_recorded_warm_start_command_parses(record: Path) -> None:
    command = json.loads(record.read_text())["command"]
    argv = shlex.split(command)
    assert argv[:3] == ["python", "-m", "offline.bench.warm_start"]
    args = warm_start.parser().parse_args(argv[3:])
    assert len(args.note) >= 2
    assert f"`{command}`" in (record.parent / "results.md").read_text()
