import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import pytest

from offline.cli import build_parser, main
from offline.cli.common import default_configs_dir, shipped_configs
from tests.tiny import TINY, prepare_tiny, train_tiny


def subcommands() -> list[str]:
    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    return sorted(action.choices)


@pytest.mark.parametrize("command", [[], *[[c] for c in subcommands()]])
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as info:
        main([*command, "--help"])
    assert info.value.code == 0
    assert "usage: seqrec" in capsys.readouterr().out


def test_version_is_the_installed_release(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"seqrec {importlib.metadata.version('seqrec')}"


def test_prepare_then_evaluate_popularity(write, tmp_path, capsys):
    log = "user_id,item_id,timestamp\n" + "".join(
        f"u{u},{item},{t}\n" for u in range(6) for t, item in enumerate(["a", "b", "c", "a", "d"][: 3 + u % 3])
    )
    out = tmp_path / "prepared"
    assert main(["prepare", "--dataset", "csv", "--path", str(write("log.csv", log)), "--out", str(out)]) == 0
    assert "6 users, 4 items" in capsys.readouterr().out
    assert main(["evaluate", "--model", "popularity", "--data", str(out), "--ks", "1,2"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result) >= {"valid", "test"}
    # Sequences a b c | a b c a | a b c a d: the 4-item users' test target and the 5-item users' validation
    # target repeat "a", so 2 of 6 targets in each split; `auto` therefore allows repeats.
    assert result["repeat_targets"] == {"valid": round(2 / 6, 6), "test": round(2 / 6, 6)}
    assert result["repeats"] == "allow"
    assert main(["evaluate", "--model", "popularity", "--data", str(out), "--ks", "1,2", "--repeats", "exclude"]) == 0
    excluded = json.loads(capsys.readouterr().out)
    assert excluded["repeats"] == "exclude"
    # Test targets c, c (after a b), a, a (repeats), d, d. Under exclude the history goes, so the fresh targets
    # rank first and the repeats are misses: 4 of 6. Under allow a, b (and c) stay ahead of the fresh targets
    # and only the two repeats of "a", the most popular item, are hits: 2 of 6.
    assert excluded["test"]["HR@2"] == round(4 / 6, 6)
    assert result["test"]["HR@2"] == round(2 / 6, 6)
    assert set(result["test"]) == {f"{m}@{k}" for m in ("HR", "NDCG", "MRR", "Recall") for k in (1, 2)}


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "offline.cli", *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_missing_file_is_one_line_without_traceback(tmp_path):
    missing = str(tmp_path / "nope.txt")
    result = run_cli("prepare", "--dataset", "s3rec", "--path", missing, "--out", str(tmp_path / "o"))
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("seqrec: error: ")
    assert "nope.txt" in result.stderr


def test_an_error_that_loads_faiss_is_still_one_line(tmp_path):
    # faiss logs each SIMD build it cannot load ("ModuleNotFoundError(...)") at INFO while importing
    result = run_cli("serve", "--artifact", str(tmp_path / "nope"))
    assert result.returncode == 1
    assert result.stderr.strip() == f"seqrec: error: {tmp_path / 'nope'}: no such folder (set SEQREC_ARTIFACTS or " \
                                    "--artifacts)"


@pytest.mark.parametrize("debug", [False, True])
def test_scripts_log_faiss_loader_lines_only_with_debug(debug):
    # the bench scripts (python -m offline.bench.*) set up logging through configure_logging, as the CLI does
    code = ("import logging; from offline.cli.common import configure_logging; "
            f"configure_logging(logging.INFO, debug={debug}); import faiss; logging.getLogger('bench').info('ready')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "INFO bench: ready" in result.stderr
    assert ("faiss.loader" in result.stderr) is debug


def test_an_output_folder_that_cannot_be_made_is_one_line(write, tmp_path):
    blocker = write("a-file", "not a folder\n")
    config = write("pipeline.yaml", "name: p\ndata:\n  dataset: synthetic\n")
    commands = [("prepare", "--dataset", "synthetic", "--out", str(blocker / "data")),
                ("pipeline", "--config", str(config), "--out", str(blocker / "artifacts"))]
    for argv in commands:
        result = run_cli(*argv)
        assert result.returncode == 1, argv[0]
        assert result.stderr.strip().splitlines()[-1] == f"seqrec: error: {blocker}: a file, where a folder is needed"
        assert "internal error" not in result.stderr
    assert blocker.read_text() == "not a folder\n"


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc, where no folder can be made")
def test_an_output_folder_that_cannot_be_written_names_it():
    result = run_cli("prepare", "--dataset", "synthetic", "--out", "/proc/seqrec-out")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith("seqrec: error: /proc/seqrec-out: "), result.stderr


def test_malformed_line_names_file_and_line(write, tmp_path):
    path = write("log.csv", "user_id,item_id,timestamp\n1,a,1\n1,b\n")
    result = run_cli("-q", "prepare", "--dataset", "csv", "--path", str(path), "--out", str(tmp_path / "o"))
    assert result.returncode == 1
    assert result.stderr.strip() == f"seqrec: error: {path}:3: expected 3 fields separated by ',', found 2"
    assert not (tmp_path / "o").exists()


def test_unknown_column_and_debug_traceback(write, tmp_path):
    path = write("log.csv", "user,item,ts\n1,a,1\n")
    args = ["prepare", "--dataset", "csv", "--path", str(path), "--out", str(tmp_path / "o")]
    result = run_cli(*args)
    assert "no column 'user_id' (columns: user, item, ts)" in result.stderr
    assert "Traceback" not in result.stderr
    debug = run_cli(*args, "--debug")
    assert debug.returncode != 0
    assert "Traceback" in debug.stderr


def test_bad_flag_values(tmp_path, capsys):
    assert main(["evaluate", "--model", "popularity", "--data", str(tmp_path / "none")]) == 1
    assert "no such prepared dataset folder" in capsys.readouterr().err
    synthetic = ["prepare", "--dataset", "synthetic", "--out", str(tmp_path / "o")]
    assert main([*synthetic, "--min-user-interactions", "1"]) == 1
    assert ">= 3" in capsys.readouterr().err
    assert main(["prepare", "--dataset", "s3rec", "--download", "--out", str(tmp_path / "o")]) == 1
    assert "--download works for" in capsys.readouterr().err


def test_configs_are_looked_up_in_the_working_folder_then_in_what_seqrec_ships(tmp_path, monkeypatch):
    shipped = shipped_configs()
    assert (shipped / "pipeline" / "demo.yaml").is_file()
    monkeypatch.chdir(tmp_path)
    assert default_configs_dir() == shipped
    assert build_parser().parse_args(["bench", "--data", "d", "--out", "o"]).configs_dir == shipped
    (tmp_path / "configs").mkdir()
    assert default_configs_dir() == Path("configs")


@pytest.mark.parametrize(("argv", "message"), [
    (["bench", "parity", "--artifact", "a", "--data", "d", "--k", "0"], "argument --k: must be >= 1, got 0"),
    (["bench", "serve", "--artifact", "a", "--out", "o", "--duration", "0"], "argument --duration: must be > 0, got 0"),
    (["bench", "serve", "--artifact", "a", "--out", "o", "--requests", "x"], "argument --requests: not a number: 'x'"),
    (["evaluate", "--artifact", "a", "--data", "d", "--batch-size", "0"], "argument --batch-size: must be >= 1, got 0"),
    (["evaluate", "--artifact", "a", "--data", "d", "--depth", "-1"], "argument --candidates/--depth: must be >= 1"),
    # nan passed every bound: `tune --budget-minutes nan` never stopped
    (["tune", "--data", "d", "--out", "o", "--budget-minutes", "nan"], "argument --budget-minutes: not a finite"),
    (["tune", "--data", "d", "--out", "o", "--budget-minutes", "-1"], "argument --budget-minutes: must be > 0, got -1"),
    (["bench", "--data", "d", "--out", "o", "--budget-minutes", "nan"], "argument --budget-minutes: not a finite"),
    (["bench", "parity", "--artifact", "a", "--data", "d", "--ready-timeout", "inf"], "--ready-timeout: not a finite"),
    # a negative seed was an internal error (numpy's ValueError) in each of these
    (["prepare", "--dataset", "synthetic", "--out", "o", "--seed", "-1"], "argument --seed: must be >= 0, got -1"),
    (["train-ranker", "--artifact", "a", "--data", "d", "--seed", "-1"], "argument --seed: must be >= 0, got -1"),
    (["tune", "--data", "d", "--out", "o", "--seed", "-1"], "argument --seed: must be >= 0, got -1"),
    (["bench", "index", "--out", "o", "--seed", "-1"], "argument --seed: must be >= 0, got -1"),
    (["train", "--data", "d", "--out", "o", "--seed", str(2**32)], f"argument --seed: must be <= {2**32 - 1}"),
    # each failed later with an internal error or, for --concurrency, a server's traceback
    (["bench", "serve", "--artifact", "a", "--out", "o", "--concurrency", "0"], "argument --concurrency: must be >= 1"),
    (["bench", "index", "--out", "o", "--dim", "0"], "argument --dim: must be >= 1, got 0"),
    (["bench", "latency", "--models", "m", "--out", "o", "--n-items", "1"], "argument --n-items: must be >= 2, got 1"),
    # a Parquet file named like the folder was written
    (["recommend", "--artifact", "a", "--data", "d", "--all", "--out", "recs/"], "argument --out: 'recs/' names a"),
])
def test_sizes_are_checked_when_parsed(argv, message, capsys):
    """`bench parity --k 0` started a server and then failed with an internal error on its first 422."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_lists_are_checked_before_any_work(tmp_path, capsys):
    """Each was an internal error (OverflowError, ValueError) before."""
    data = prepare_tiny(tmp_path / "data")
    cases = [
        (["evaluate", "--model", "popularity", "--data", str(data), "--ks", "99999999999999999999"],
         "--ks values must be at most 2,147,483,647, got 99999999999999999999"),
        (["bench", "serve", "--artifact", "a", "--out", str(tmp_path / "o"), "--rates", "a"],
         "--rates must be comma-separated numbers, got 'a'"),
        (["bench", "two-stage", "--data", str(data), "--out", str(tmp_path / "o"), "--holdout-only", "--config",
          str(shipped_configs() / "ml-100k" / "transformer.yaml"), "--seeds", "a"],
         "--seeds must be comma-separated integers, got 'a'"),
        (["bench", "two-stage", "--data", str(data), "--out", str(tmp_path / "o"), "--artifact", "a", "--seeds", "1"],
         "--seeds goes with --holdout-only; with --artifact, each bundle's training seed counts"),  # was ignored
    ]
    for argv, message in cases:
        assert main(argv) == 1
        assert capsys.readouterr().err.strip().splitlines() == [f"seqrec: error: {message}"]
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(("override", "message"), [
    # each trained to all-zero scores (temperature) or to NaN and an internal error (the rest)
    (["--model.temperature", "inf"], "model.temperature: Input should be a finite number"),
    (["--train.lr", "inf"], "train.lr: Input should be a finite number"),
    (["--train.weight_decay", "nan"], "train.weight_decay: Input should be a finite number"),
    (["--train.betas", "[2, 3]"], "train.betas.0: Input should be less than 1"),  # torch's ValueError before
])
def test_values_no_training_can_use_are_config_errors(override, message, tmp_path, capsys):
    data = prepare_tiny(tmp_path / "data")
    capsys.readouterr()
    assert main(["train", "--data", str(data), "--out", str(tmp_path / "o"), *TINY, *override]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert message in err[0]
    assert not (tmp_path / "o").exists()


def test_a_training_that_diverges_stops_with_what_to_change(tmp_path, capsys):
    """It ran to its validation, where the NaN scores were an internal error ('scores contain NaN')."""
    data = prepare_tiny(tmp_path / "data")
    capsys.readouterr()
    assert main(["train", "--data", str(data), "--out", str(tmp_path / "o"), *TINY, "--train.lr", "1e30"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("seqrec: error: training diverged: the loss is nan at epoch 1, step ")
    assert err[0].endswith("; lower train.lr (1e+30)")


def test_resume_on_other_data_is_refused(tmp_path, capsys):
    """It continued silently: the checkpoint of one dataset trained on, and the bundle said it was of the other."""
    data, out = prepare_tiny(tmp_path / "data"), tmp_path / "o"
    other = tmp_path / "other"
    assert main(["prepare", "--dataset", "synthetic", "--n-users", "150", "--n-items", "60", "--mean-length", "12",
                 "--seed", "2", "--out", str(other), "-q"]) == 0
    trained = (train_tiny(data, out) / "retriever.pt").read_bytes()
    capsys.readouterr()
    assert main(["train", "--data", str(other), "--out", str(out), *TINY, "--resume", "-q"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"seqrec: error: {out / 'run'}: its checkpoint was trained on other data (150 users")
    assert err[0].endswith("resume with that --data, or choose a new --out")
    assert (out / "retriever.pt").read_bytes() == trained


def test_a_key_given_twice_in_a_config_is_refused(tmp_path, capsys):
    """PyYAML keeps the last: a second `train:` section silently replaced the first."""
    from retriever.config import read_yaml

    config = tmp_path / "twice.yaml"
    config.write_text("train:\n  lr: 0.01\nmodel:\n  d_model: 16\ntrain:\n  epochs: 2\n")
    assert main(["train", "--config", str(config), "--data", str(tmp_path / "d"), "--out", str(tmp_path / "o")]) == 1
    assert capsys.readouterr().err.strip() == f"seqrec: error: {config}: key 'train' is given twice (line 5)"
    merged = tmp_path / "merged.yaml"  # a merge key's keys may be given again: that is what it is for
    merged.write_text("base: &base {lr: 0.01, epochs: 2}\ntrain: {<<: *base, epochs: 3}\n")
    assert read_yaml(merged, "config")["train"] == {"lr": 0.01, "epochs": 3}
    for committed in sorted(shipped_configs().rglob("*.yaml")):  # none of ours gives a key twice
        read_yaml(committed, "config")


def test_a_sigterm_unwinds_and_leaves_no_staging_folder(tmp_path, monkeypatch, capsys):
    """Killed outright by SIGTERM, prepare left its hidden staging folder beside --out, one more each time; the
    program (main without argv) now turns SIGTERM into an exception that runs the cleanup, then exits 143."""
    import os
    import signal

    import pyarrow.parquet as pq

    from offline.cli import seqrec

    write_table = pq.write_table

    def terminated_mid_write(table, where, *args, **kwargs):  # type: ignore[no-untyped-def]
        write_table(table, where, *args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)  # as `kill PID` would, while the folder is half written

    previous = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(pq, "write_table", terminated_mid_write)
    monkeypatch.setattr(sys, "argv", ["seqrec", "prepare", "--dataset", "synthetic", "--n-users", "50",
                                      "--out", str(tmp_path / "p"), "-q"])
    try:
        assert seqrec.main() == 143
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert capsys.readouterr().err.strip().endswith("seqrec: terminated")
    assert list(tmp_path.iterdir()) == []


def test_a_prepared_folder_gets_the_mode_a_plain_folder_would(tmp_path):
    """mkdtemp's 0700 stayed on it: a service or a colleague under another user could not read the data."""
    import os

    umask = os.umask(0o022)
    try:
        prepare_tiny(tmp_path / "data")
        (tmp_path / "plain").mkdir()
    finally:
        os.umask(umask)
    assert (tmp_path / "data").stat().st_mode & 0o777 == (tmp_path / "plain").stat().st_mode & 0o777 == 0o755
