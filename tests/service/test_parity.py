"""The service answers what the offline pipeline computes, and micro-batching changes no answer.

`test_every_test_user_is_served_as_evaluated` is the whole claim: every test user, repeat targets included, the
default request over HTTP against the lists and NDCG@10 `seqrec evaluate` counts (`offline.bench.quality.parity`). The
score-level tests below check the ranker's scores and retrieval scores on a dozen users whose target is new.

Offline reference of the score-level tests, as `offline.jobs.evaluate.evaluate_bundle` scores the test split:
`offline.jobs.mine.mine` (index search, history excluded), `ranker.train.make_groups` + `features`, the
bundle's ranker `score`; top k by score, ties in retrieval order. The service is checked twice against it:
`service.system.recommend.recommend_batch` in this process (all users in one batch) and `POST /recommend` over HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch

from offline.bench.quality.parity import TOLERANCE as NDCG_TOLERANCE
from offline.bench.quality.parity import compare
from offline.data.prepared import load_prepared
from offline.jobs.evaluate import evaluate_bundle, two_stage_top
from offline.jobs.mine import mine
from ranker.artifact import load_ranker, unit_item_vectors
from ranker.train import FeatureSource, features, group_ranks, make_groups
from retriever.artifact import load_artifact
from service.system.encode import unit_user_vectors
from service.system.loader import load_bundle, served_encoder
from service.system.recommend import Query, recommend_batch
from tests.service.support import Server, metric_samples

DEPTH, K, N_USERS = 20, 10, 12
TOLERANCE = 1e-4


@dataclass(frozen=True)
class Case:
    history: list[int]  # internal ids, oldest first (the whole test-split input)
    external: list[str]
    items: list[int]  # offline top K: internal ids, best first
    scores: np.ndarray  # their ranker scores
    retrieval: np.ndarray  # their retrieval (cosine) scores


@pytest.fixture(scope="module")
def cases(prepared: Path, bundle: Path) -> list[Case]:
    data = load_prepared(prepared)
    artifact = load_artifact(bundle)
    ranker = load_ranker(bundle, artifact.manifest)
    assert ranker is not None
    assert np.array_equal(artifact.item_ids, data.item_ids[1:].astype(str))
    inputs, targets = data.split().inputs("test"), data.split().test_targets
    start, end = inputs.offsets[:-1], inputs.offsets[1:]
    # users whose target is new (scores are compared here; the exclusion of repeats is the every-user test's),
    # short and long histories (max_len is 10)
    fresh = [u for u in range(len(targets)) if targets[u] not in inputs.items[start[u] : end[u]]]
    by_length = sorted(fresh, key=lambda u: int(end[u] - start[u]))
    rows = np.array(sorted({*by_length[: N_USERS // 2], *by_length[-N_USERS // 2 :]}))
    assert (end[rows] - start[rows]).max() > artifact.max_len

    mined = mine(served_encoder(artifact), artifact.index, inputs.items, start[rows], end[rows], targets[rows],
                 depth=DEPTH, max_len=artifact.max_len)
    groups = make_groups(mined, inputs.items, artifact.max_len)
    source = FeatureSource(ranker.tables.torch(), unit_item_vectors(artifact.model.item_vectors().detach()))
    scores = ranker.ranker.score(features(source, groups, np.arange(len(rows)))).double().numpy()
    out = []
    for g, u in enumerate(rows):
        assert (mined.candidates[g] > 0).all()
        order = np.argsort(-scores[g], kind="stable")[:K]
        history = inputs.items[start[u] : end[u]].tolist()
        out.append(Case(history, [str(data.item_ids[i]) for i in history], mined.candidates[g, order].tolist(),
                        scores[g, order], mined.scores[g, order].astype(np.float64)))
    return out


def test_recommend_batch_matches_offline(cases: list[Case], bundle: Path) -> None:
    served = load_bundle(bundle)
    max_len = served.max_len
    queries = [Query(c.history[-max_len:], k=K, candidates=DEPTH, exclude=tuple(c.history[:-max_len]))
               for c in cases]
    results = recommend_batch(served, queries)  # one batch: histories of different lengths padded together
    for case, result in zip(cases, results, strict=True):
        assert result.reranked
        assert [i for i, _, _ in result.items] == case.items
        np.testing.assert_allclose([s for _, s, _ in result.items], case.scores, atol=TOLERANCE, rtol=0)
        np.testing.assert_allclose([r for _, _, r in result.items], case.retrieval, atol=TOLERANCE, rtol=0)


@pytest.fixture(scope="module")
def client(api: Server) -> Iterator[httpx.Client]:
    with api.client() as c:
        yield c


def test_http_matches_offline(cases: list[Case], client: httpx.Client, bundle: Path) -> None:
    catalogue = [str(i) for i in np.load(bundle / "item_ids.npy", allow_pickle=False)]
    for case in cases:
        response = client.post("/recommend", json={"history": case.external, "k": K, "candidates": DEPTH})
        assert response.status_code == 200, response.text
        items = response.json()["items"]
        assert [i["item_id"] for i in items] == [catalogue[i - 1] for i in case.items]
        np.testing.assert_allclose([i["score"] for i in items], case.scores, atol=TOLERANCE, rtol=0)
        np.testing.assert_allclose([i["retrieval_score"] for i in items], case.retrieval, atol=TOLERANCE, rtol=0)


def _bodies(bundle: Path, n: int) -> list[dict[str, Any]]:
    """n different requests: history lengths 1..25, several k and depths, rerank on and off, some personalized."""
    catalogue = [str(i) for i in np.load(bundle / "item_ids.npy", allow_pickle=False)]
    rng = np.random.default_rng(7)
    return [{"history": rng.choice(catalogue, size=1 + i % 25, replace=False).tolist(), "k": 5 + i % 7,
             "candidates": (20, 50)[i % 2], "rerank": i % 5 != 0, "personalize": i % 9 == 4} for i in range(n)]


def _answer(response: httpx.Response) -> list[tuple[str, float, float]]:
    assert response.status_code == 200, response.text
    return [(i["item_id"], i["score"], i["retrieval_score"]) for i in response.json()["items"]]


def test_concurrent_burst_is_batched_and_changes_no_answer(api: Server, client: httpx.Client, bundle: Path) -> None:
    """50 concurrent requests: all 200, answered in batches of more than one, each answer equal to the one the
    same request got alone."""
    bodies = _bodies(bundle, 50)
    alone = [_answer(client.post("/recommend", json=body)) for body in bodies]
    before = metric_samples(client.get("/metrics").text, "seqrec_batch_size_bucket")

    async def burst() -> list[httpx.Response]:
        async with api.async_client() as session:
            return list(await asyncio.gather(*(session.post("/recommend", json=body) for body in bodies)))

    responses = asyncio.run(burst())
    assert [r.status_code for r in responses] == [200] * len(bodies)
    for body, response, expected in zip(bodies, responses, alone, strict=True):
        got = _answer(response)
        assert [i for i, _, _ in got] == [i for i, _, _ in expected], body
        np.testing.assert_allclose([s for _, s, _ in got], [s for _, s, _ in expected], atol=1e-6, rtol=0)
        np.testing.assert_allclose([r for _, _, r in got], [r for _, _, r in expected], atol=1e-6, rtol=0)

    after = metric_samples(client.get("/metrics").text, "seqrec_batch_size_bucket")
    single = after['{le="1.0"}'] - before.get('{le="1.0"}', 0.0)
    batches = after['{le="+Inf"}'] - before.get('{le="+Inf"}', 0.0)
    assert batches > single, f"no batch of more than one request in {batches:.0f} batches"
    assert batches < len(bodies)


def test_every_test_user_is_served_as_evaluated(api: Server, bundle: Path, prepared: Path) -> None:
    """Every test user, repeat targets included (the data has them, so the repeat policy is exercised): the
    served top-10 of the default request equals the offline two-stage top-10, and so do the NDCG@10s."""
    data = load_prepared(prepared)
    split = data.split()
    inputs, targets = split.inputs("test"), split.test_targets
    assert any(targets[u] in inputs.row(u) for u in range(len(targets))), "no repeat target in the test data"
    parity = compare(api.url, bundle, data, k=K)
    assert parity.users == data.n_users
    assert parity.differ == [], parity.line()
    assert abs(parity.served_ndcg - parity.offline_ndcg) <= NDCG_TOLERANCE, parity.line()



def test_offline_lists_come_from_the_evaluations_ranks(bundle: Path, prepared: Path) -> None:
    """`two_stage_top` ranks every test target as `seqrec evaluate` and the ranker's own evaluation do."""
    data = load_prepared(prepared)
    reranked, targets = two_stage_top(bundle, data, k=K)
    assert len(targets) == data.n_users
    assert reranked.top.shape == (data.n_users, K)
    artifact = load_artifact(bundle)
    ranker = load_ranker(bundle, artifact.manifest)
    assert ranker is not None
    inputs = data.split().inputs("test")
    mined = mine(served_encoder(artifact), artifact.index, inputs.items, inputs.offsets[:-1], inputs.offsets[1:],
                 targets, depth=ranker.depth, max_len=artifact.max_len)
    source = FeatureSource(ranker.tables.torch(), unit_item_vectors(artifact.model.item_vectors().detach()))
    groups = make_groups(mined, inputs.items, artifact.max_len)
    expected = group_ranks(ranker.ranker.score, source, groups, data.n_items)
    assert np.array_equal(reranked.ranks, expected)
    found = (reranked.top == targets[:, None]).any(1)
    assert np.array_equal(found, reranked.ranks <= K)  # the target is in the list exactly when it ranks in the top K


def test_evaluate_at_another_depth(bundle: Path, prepared: Path) -> None:
    data = load_prepared(prepared)
    default = evaluate_bundle(bundle, data)
    deeper = evaluate_bundle(bundle, data, depth=2 * DEPTH)
    assert (default["depth"], default["ranker_depth"]) == (DEPTH, DEPTH)
    assert (deeper["depth"], deeper["ranker_depth"]) == (2 * DEPTH, DEPTH)
    for split in ("valid", "test"):  # more candidates never lose a target the retriever found
        assert deeper[f"recall@{2 * DEPTH}"][split] >= default[f"recall@{DEPTH}"][split]


def test_default_candidates_is_the_rankers_depth(client: httpx.Client, cases: list[Case]) -> None:
    assert client.get("/readyz").json()["candidates"] == DEPTH
    schema = client.get("/openapi.json").json()["components"]["schemas"]["RecommendRequest"]["properties"]
    assert schema["candidates"].get("default") is None
    assert "trained and evaluated" in schema["candidates"]["description"]
    for case in cases:
        default = _answer(client.post("/recommend", json={"history": case.external, "k": K}))
        explicit = _answer(client.post("/recommend", json={"history": case.external, "k": K, "candidates": DEPTH}))
        assert default == explicit


def test_the_offline_user_vectors_are_the_served_ones_bit_for_bit(bundle: Path, prepared: Path) -> None:
    """Offline mining and evaluation encode histories with the encoder the service runs (ONNX Runtime where the
    bundle compiles), not the eager one: the two agree to ~1e-6, enough to flip an exact near-tie (it flipped 2
    of 22,363 Beauty test users' lists of a dot-product BSARec bundle before)."""
    served = load_bundle(bundle)
    assert served.inference["encoder"] == "onnx"
    histories = load_prepared(prepared).split().inputs("test").padded(np.arange(64), served.max_len)
    history = torch.from_numpy(histories)
    offline = unit_user_vectors(served_encoder(load_artifact(bundle)), history)
    assert torch.equal(offline, torch.nn.functional.normalize(served.encode(history), dim=-1))
