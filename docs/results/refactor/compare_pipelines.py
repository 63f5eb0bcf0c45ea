import json, sys
def m(p):
    d = json.load(open(p))["stages"]
    out = {"train.valid": d["train"]["valid_ndcg@10"], "train.test": d["train"]["test_ndcg@10"], "mine.recall": d["mine"]["recall"],
           "ranker.valid": d["train-ranker"]["selection"]["valid_ndcg@10"]}
    for s in ("valid", "test", "retriever_valid", "retriever_test"):
        out[s] = d["evaluate"].get(s)
    return out
a, b = m(sys.argv[1]), m(sys.argv[2])
print("identical" if a == b else "DIFFERENT")
for k in a:
    if a[k] != b[k]:
        print(k, a[k], b[k])
