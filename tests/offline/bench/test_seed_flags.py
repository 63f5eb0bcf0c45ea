"""The benchmark scripts run as `python -m offline.bench.<group>.<name>` check --seed as `seqrec`'s commands do."""

from __future__ import annotations

import importlib

import pytest

from offline.bench.faults.reliability import scenario_parser


@pytest.mark.parametrize("module", ["serve.shed", "compute.compiled", "compute.serve_stages",
                                    "serve.latency_split", "serve.replicas"])
@pytest.mark.parametrize(("seed", "message"), [("-1", "must be >= 0, got -1"), (str(2**32), f"must be <= {2**32 - 1}")])
def test_a_seed_numpy_cannot_take_is_refused_when_parsed(module, seed, message, capsys):
    """Each took any integer and failed later inside numpy (`Seed must be between 0 and 2**32 - 1`)."""
    main = importlib.import_module(f"offline.bench.{module}").main
    with pytest.raises(SystemExit) as info:
        main(["--seed", seed])
    assert info.value.code == 2
    assert f"argument --seed: {message}" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["split", "--seed", "-1"], ["evaluate", "--seed", "-1"]])
def test_the_cold_start_benchmarks_seeds_are_checked(argv, capsys):
    from offline.bench.quality.cold_start import main

    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert "argument --seed: must be >= 0, got -1" in capsys.readouterr().err


def test_the_reliability_scenarios_seed_is_checked(capsys):
    with pytest.raises(SystemExit):
        scenario_parser(None).parse_args(["--seed", "-1"])
    assert "argument --seed: must be >= 0, got -1" in capsys.readouterr().err
