"""The served two-stage system as a library, without HTTP: the bundle, the retrieve step (window, exclusion, filters,
FAISS), the merge of candidate sources, the features, the rerank and the top k. `POST /recommend`
(`service.http`), mining, `seqrec evaluate` and `seqrec recommend` call the same functions."""
