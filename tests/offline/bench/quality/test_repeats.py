"""`python -m offline.bench.quality.repeats`: the shares table of prepared folders and the policy table of a run."""

import json
from pathlib import Path

from offline.bench.quality.repeats import main, policy_table
from offline.cli import main as seqrec


def test_shares_of_prepared_folders_and_the_policy_auto_picks(write, tmp_path: Path) -> None:
    fresh = "user_id,item_id,timestamp\n" + "".join(f"u{u},{i},{t}\n" for u in range(3) for t, i in enumerate("abcd"))
    again = "user_id,item_id,timestamp\n" + "".join(f"u{u},{i},{t}\n" for u in range(3) for t, i in enumerate("abab"))
    folders = []
    for name, text in (("fresh", fresh), ("again", again)):
        folders.append(tmp_path / name)
        assert seqrec(["prepare", "--dataset", "csv", "--path", str(write(f"{name}.csv", text)), "--out",
                       str(folders[-1]), "-q"]) == 0
    assert main(["--out", str(tmp_path / "out"), "--prepared", *map(str, folders)]) == 0
    rows = json.loads((tmp_path / "out" / "shares.json").read_text())
    assert [(r["repeat_targets"], r["auto"]) for r in rows] == [
        ({"valid": 0.0, "test": 0.0}, "exclude"), ({"valid": 1.0, "test": 1.0}, "allow")]
    assert "| again | 3 | 100.00% | 100.00% | allow |" in (tmp_path / "out" / "shares.md").read_text()


def test_the_policy_table_names_the_policy_system_and_depth_of_every_row() -> None:
    metrics = {"HR@10": 0.5, "NDCG@10": 0.25, "MRR@10": 0.125}
    run = {"system": "two-stage", "depth": 100, **{s: metrics for s in ("valid", "test", "retriever_valid",
                                                                        "retriever_test")}}
    table = policy_table({"repeat_targets": {"valid": 0.4, "test": 0.5}, "auto": "allow",
                          "runs": {"exclude": run, "allow": run}})
    assert "| exclude | two-stage (depth 100) | test | 0.5000 | 0.2500 | 0.1250 |" in table
    assert "| allow | retriever | valid |" in table
    assert "40.0% of validation, 50.0% of test; `train.repeats: auto` picks allow" in table
