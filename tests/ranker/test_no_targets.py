"""Ranker training with no group that holds its target is one error naming the cause (LightGBM failed with an
internal "need at least one array to concatenate"; the MLP's advice to mine deeper was wrong when every
target repeats a history item that repeats: exclude keeps out of the candidates)."""

from pathlib import Path

import numpy as np
import pytest

from common.errors import SeqrecError
from offline.cli import main
from ranker.mining import Mined
from ranker.train import Groups, check_targets
from tests.tiny import TINY


@pytest.fixture(scope="module")
def repeats_only(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """40 users who each play one of 10 items 6 times, and a retriever trained under repeats: exclude."""
    work = tmp_path_factory.mktemp("repeats")
    rows = [f"u{u},i{u % 10},{1000 + 100 * t + u}" for u in range(40) for t in range(6)]
    (work / "log.csv").write_text("user,item,ts\n" + "\n".join(rows) + "\n")
    data, bundle = work / "data", work / "bundle"
    assert main(["prepare", "--dataset", "csv", "--path", str(work / "log.csv"), "--user-col", "user", "--item-col",
                 "item", "--time-col", "ts", "--out", str(data), "-q"]) == 0
    assert main(["train", "--data", str(data), "--out", str(bundle), *TINY, "--train.repeats", "exclude", "-q"]) == 0
    return data, bundle


@pytest.mark.parametrize("kind", ["lgbm", "mlp", "auto"])
def test_every_target_a_repeat_kept_out_of_the_candidates_is_one_line(repeats_only: tuple[Path, Path], kind: str,
                                                                      capsys: pytest.CaptureFixture) -> None:
    data, bundle = repeats_only
    capsys.readouterr()
    assert main(["train-ranker", "--artifact", str(bundle), "--data", str(data), "--kind", kind, "--mining",
                 "direct", "--epochs", "1", "--threads", "1", "-q"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        "seqrec: error: none of the 120 ranker training groups holds its target among its candidates: every target "
        "repeats an item of its user's history, which the bundle's repeats: exclude keeps out of the candidates; "
        "a ranker has nothing to learn (a retriever trained with train.repeats allow ranks repeats)"]
    assert not (bundle / "ranker").exists()


def _groups(candidates: list[list[int]], target: list[int], start: list[int], end: list[int]) -> Groups:
    mined = Mined(np.array(start), np.array(end), np.array(target), np.array(candidates),
                  np.zeros((len(target), len(candidates[0])), dtype=np.float32))
    return Groups(mined, np.zeros((len(target), 1), dtype=np.int64), None)  # type: ignore[arg-type]


def test_targets_the_retriever_missed_ask_for_more_depth_or_name_the_repeats() -> None:
    items = np.array([5, 6, 7, 5])  # one user's history: group 0 sees [5, 6], group 1 sees [5, 6, 7]
    hit = _groups([[3, 4]], [3], [0], [2])
    missed = _groups([[1, 2], [1, 2]], [3, 5], [0, 0], [2, 3])  # target 5 repeats the history, 3 does not
    sources = {"train": items, "valid": items}
    check_targets({"train": hit, "valid": hit}, sources, "exclude", 40)
    with pytest.raises(SeqrecError) as err:
        check_targets({"train": missed, "valid": hit}, sources, "allow", 40)
    assert str(err.value) == ("none of the 2 ranker training groups holds its target among its candidates: the "
                              "retriever returned none of them; raise --depth (now 2)")
    with pytest.raises(SeqrecError) as err:
        check_targets({"train": missed, "valid": hit}, sources, "exclude", 2)
    assert str(err.value) == ("none of the 2 ranker training groups holds its target among its candidates: the "
                              "retriever returned none of them; --depth 2 already covers the catalogue; 1 of the "
                              "targets repeat an item of their user's history, which the bundle's repeats: exclude "
                              "keeps out of the candidates")
    with pytest.raises(SeqrecError, match=r"^none of the 2 ranker validation groups holds its target"):
        check_targets({"train": hit, "valid": missed}, sources, "allow", 40)
