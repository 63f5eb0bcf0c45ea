"""Print `identical` when two pipeline.json records hold the same metrics, else the ones that differ."""

import json
import sys
from typing import Any


def metrics(path: str) -> dict[str, Any]:
    with open(path) as handle:
        stages = json.load(handle)["stages"]
    out = {"train.valid": stages["train"]["valid_ndcg@10"], "train.test": stages["train"]["test_ndcg@10"],
           "mine.recall": stages["mine"]["recall"],
           "ranker.valid": stages["train-ranker"]["selection"]["valid_ndcg@10"]}
    for split in ("valid", "test", "retriever_valid", "retriever_test"):
        out[split] = stages["evaluate"].get(split)
    return out


if __name__ == "__main__":
    before, after = metrics(sys.argv[1]), metrics(sys.argv[2])
    print("identical" if before == after else "DIFFERENT")
    for key, value in before.items():
        if value != after[key]:
            print(key, value, after[key])
