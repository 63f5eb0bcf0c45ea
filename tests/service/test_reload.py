"""Hot reload: ``ARTIFACTS/current`` is switched atomically and ``POST /admin/reload`` loads what it names.
A good bundle replaces the served one while requests keep being answered; a corrupt or shape-mismatched one
is refused with the reason (409) and the old one keeps serving."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.service.support import (
    Server,
    corrupt_weights,
    metric_samples,
    mismatch_shapes,
    point_current,
    seqrec,
    serving,
    train_bundle,
)


@dataclass(frozen=True)
class Artifacts:
    root: Path
    v1: Path
    v2: Path
    corrupt: Path
    shapes: Path
    empty: Path

    def version(self, bundle: Path) -> str:
        return str(json.loads((bundle / "manifest.json").read_text())["version"])


@pytest.fixture(scope="module")
def artifacts(bundle: Path, prepared: Path, tmp_path_factory: pytest.TempPathFactory) -> Artifacts:
    root = tmp_path_factory.mktemp("artifacts")
    v1 = Path(shutil.copytree(bundle, root / "v1"))
    v2 = train_bundle(prepared, root / "v2", seed=4)
    corrupt = Path(shutil.copytree(bundle, root / "corrupt"))
    corrupt_weights(corrupt)
    shapes = Path(shutil.copytree(bundle, root / "shapes"))
    mismatch_shapes(shapes)
    empty = root / "empty"
    empty.mkdir()
    point_current(root, v1)
    found = Artifacts(root, v1, v2, corrupt, shapes, empty)
    assert found.version(v1) != found.version(v2)
    return found


@pytest.fixture(scope="module")
def server(artifacts: Artifacts, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with serving(tmp_path_factory.mktemp("reload-api"), artifacts=str(artifacts.root)) as api:
        yield api


@pytest.fixture
def client(server: Server, artifacts: Artifacts) -> Iterator[httpx.Client]:
    """A client; afterwards ``current`` names v1 and v1 is served again, whatever the test did (/readyz names no
    folder, so the served one is put back rather than looked up)."""
    with server.client() as c:
        yield c
        point_current(artifacts.root, artifacts.v1)
        assert c.post("/admin/reload").status_code == 200


def _reload(client: httpx.Client, status: int = 200) -> dict[str, Any]:
    response = client.post("/admin/reload")
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()
    return body


def _serving(client: httpx.Client) -> str:
    version: str = client.get("/readyz").json()["model_version"]
    return version


def test_nothing_changed(client: httpx.Client) -> None:
    served = _serving(client)
    body = _reload(client)
    assert body["status"] == "unchanged"
    assert body["model_version"] == body["previous_version"] == served


def test_good_bundle_under_load(server: Server, client: httpx.Client, artifacts: Artifacts) -> None:
    """Requests sent all through the reload are all answered (200), by the old model and then by the new."""
    point_current(artifacts.root, artifacts.v1)
    _reload(client)
    v1, v2 = artifacts.version(artifacts.v1), artifacts.version(artifacts.v2)
    assert _serving(client) == v1

    async def scenario() -> tuple[dict[str, Any], list[httpx.Response], list[httpx.Response]]:
        done = asyncio.Event()
        async with server.async_client() as session:

            async def load(n: int) -> list[httpx.Response]:
                answers: list[httpx.Response] = []
                while not done.is_set():
                    body = {"history": [f"i{1 + (n + len(answers)) % 30}", "i40", "i2"], "k": 5}
                    answers.append(await session.post("/recommend", json=body))
                return answers

            workers = [asyncio.create_task(load(n)) for n in range(4)]
            await asyncio.sleep(0.3)
            point_current(artifacts.root, artifacts.v2)
            reload = await session.post("/admin/reload")
            after = [await session.post("/recommend", json={"history": ["i1", "i2"], "k": 5}) for _ in range(3)]
            await asyncio.sleep(0.2)
            done.set()
            during = [r for answers in await asyncio.gather(*workers) for r in answers]
        assert reload.status_code == 200, reload.text
        return reload.json(), during, after

    reload, during, after = asyncio.run(scenario())
    assert reload["status"] == "reloaded"
    assert (reload["previous_version"], reload["model_version"]) == (v1, v2)
    assert len(during) > 10
    assert [r.status_code for r in during] == [200] * len(during)
    versions = [r.json()["model_version"] for r in during]
    assert set(versions) == {v1, v2}
    assert versions.index(v2) > 0
    assert {r.json()["model_version"] for r in after} == {v2}
    ready = client.get("/readyz").json()
    assert ready["model_version"] == v2
    assert "path" not in ready  # a client learns the version, not where the server keeps its files
    metrics = client.get("/metrics").text
    assert metric_samples(metrics, "seqrec_model_info") == {f'{{ranker="lgbm",version="{v2}"}}': 1.0}
    assert metric_samples(metrics, "seqrec_reloads_total")['{result="ok"}'] >= 1
    assert _reload(client)["status"] == "unchanged"


def test_a_ranker_retrained_in_place_is_reloaded(client: httpx.Client, artifacts: Artifacts, prepared: Path) -> None:
    """`seqrec train-ranker` on the served folder changes BUNDLE/ranker only: the reload must see it (it compared
    the retriever's manifest alone and answered "unchanged", serving the old ranker)."""
    inplace = Path(shutil.copytree(artifacts.v1, artifacts.root / "inplace"))
    point_current(artifacts.root, inplace)
    assert _reload(client)["status"] == "reloaded"
    assert client.get("/readyz").json()["candidates"] == 20
    assert seqrec(["train-ranker", "--artifact", str(inplace), "--data", str(prepared), "--kind", "lgbm",
                   "--mining", "direct", "--depth", "10", "--threads", "1", "-q"]) == 0
    body = _reload(client)
    assert body["status"] == "reloaded"
    assert body["model_version"] == body["previous_version"] == artifacts.version(inplace)  # the same retriever
    ready = client.get("/readyz").json()
    assert ready["candidates"] == 10
    assert _reload(client)["status"] == "unchanged"


@pytest.mark.parametrize(("broken", "reason"), [
    ("corrupt", "retriever.pt: checksum does not match the manifest"),
    ("shapes", "retriever.pt: does not fit the config's model"),
    ("empty", "manifest.json: missing; not a complete retriever artifact"),
])
def test_broken_bundle_is_refused(client: httpx.Client, artifacts: Artifacts, broken: str, reason: str) -> None:
    served = client.get("/readyz").json()
    before = client.post("/recommend", json={"history": ["i3", "i4"], "k": 5}).json()["items"]
    point_current(artifacts.root, getattr(artifacts, broken))
    response = client.post("/admin/reload")
    assert response.status_code == 409, response.text
    detail = response.json()["detail"]
    assert detail.startswith(f"bundle refused, still serving {served['model_version']}: ")
    assert reason in detail
    assert str(artifacts.root) not in detail  # the file is named, not the folder it lives in
    # the old bundle keeps serving, unchanged
    assert client.get("/readyz").json() == served
    answer = client.post("/recommend", json={"history": ["i3", "i4"], "k": 5})
    assert answer.status_code == 200
    assert answer.json()["model_version"] == served["model_version"]
    assert answer.json()["items"] == before
    refused = metric_samples(client.get("/metrics").text, "seqrec_reloads_total")['{result="refused"}']
    assert refused >= 1


def test_every_worker_follows_a_publish_under_load(artifacts: Artifacts,
                                                   tmp_path_factory: pytest.TempPathFactory) -> None:
    """Two workers under load: pointing `current` at a new bundle (no POST) reaches both within a poll, and
    every request meanwhile is answered."""
    point_current(artifacts.root, artifacts.v1)
    v1, v2 = artifacts.version(artifacts.v1), artifacts.version(artifacts.v2)
    api = Server(tmp_path_factory.mktemp("reload-workers"), artifacts=str(artifacts.root), workers="2",
                 reload_poll_s="0.3")
    api.workers = 2
    api.start()
    try:

        def versions(wait_s: float = 5.0) -> dict[int, str]:
            """The version each worker serves, from fresh connections until both workers have answered (or
            ``wait_s`` has passed: `start` returns when the first worker is ready, the second may still be
            loading its bundle on a slow machine)."""
            seen: dict[int, str] = {}
            deadline = time.monotonic() + wait_s
            with api.client(headers={"Connection": "close"}) as c:
                while len(seen) < 2 and time.monotonic() < deadline:
                    try:
                        ready = c.get("/readyz")
                    except httpx.TransportError:
                        continue
                    if ready.status_code == 200:
                        seen[ready.json()["worker"]] = ready.json()["model_version"]
                    if len(seen) < 2:
                        time.sleep(0.01)
            return seen

        async def scenario() -> tuple[list[httpx.Response], dict[int, str]]:
            done = asyncio.Event()
            switched = asyncio.Event()  # both workers were seen serving v2
            # each loader's first answer to a request sent after that: the load must outlast the switch, or on a
            # slow machine every request answered "during" may have been sent before it
            sent_after = [asyncio.Event() for _ in range(4)]
            answered = [asyncio.Event() for _ in range(4)]  # each loader has an answer from before the publish
            async with api.async_client() as session:

                async def load(n: int) -> list[httpx.Response]:
                    answers: list[httpx.Response] = []
                    while not done.is_set():
                        late = switched.is_set()
                        body = {"history": [f"i{1 + (n + len(answers)) % 30}", "i40"], "k": 5}
                        answers.append(await session.post("/recommend", json=body,
                                                          headers={"Connection": "close"}))
                        answered[n].set()
                        if late:
                            sent_after[n].set()
                    return answers

                loaders = [asyncio.create_task(load(n)) for n in range(4)]
                await asyncio.sleep(0.3)
                with contextlib.suppress(TimeoutError):  # a slow machine's first answers may take longer
                    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in answered)), 30)
                point_current(artifacts.root, artifacts.v2)
                after: dict[int, str] = {}
                for _ in range(40):  # up to 10 s
                    await asyncio.sleep(0.25)
                    after = await asyncio.to_thread(versions)
                    if set(after.values()) == {v2}:
                        break
                switched.set()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in sent_after)), 30)
                done.set()
                return [r for answers in await asyncio.gather(*loaders) for r in answers], after

        before = versions(wait_s=90.0)
        assert len(before) == 2
        assert set(before.values()) == {v1}
        during, after = asyncio.run(scenario())
        errors = api.server_errors()
    finally:
        api.stop()
    assert not errors, errors
    assert len(after) == 2
    assert set(after.values()) == {v2}
    assert [r.status_code for r in during] == [200] * len(during)
    assert {r.json()["model_version"] for r in during} == {v1, v2}
