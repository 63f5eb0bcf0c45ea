"""The tutorials' commands run, in a quick variant: the pages' own commands, configs and requests, on a small log
and with one training epoch (the changes each test makes are named in it). The full demo is marked slow.

Every `seqrec` command on every docs page also parses with the real parser, so a renamed flag breaks a test, not a
reader."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml

from offline.cli.seqrec import build_parser, main
from tests.docs.pages import Request, command_lines, requests, yaml_blocks

ROOT = Path(__file__).resolve().parents[2]
TUTORIALS = ROOT / "docs" / "tutorials"
QUICK = {"train.epochs": 1}  # the quick variant: one epoch for every retriever (the holdout one too)
PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md") if "results" not in p.parts)]


def run(command: str, *extra: str) -> None:
    argv = shlex.split(command)
    assert argv[0] == "seqrec"
    assert main([*argv[1:], *extra, "-q"]) == 0, command


class Client:
    """The app in process (its own lifespan: the bundle loads as `seqrec serve` loads it) on an event loop of its
    own, so a test can run CLI commands between requests."""

    def __init__(self, app: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self.lifespan = app.router.lifespan_context(app)
        self.http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://localhost")

    def request(self, method: str, path: str, body: Any) -> httpx.Response:
        return self.loop.run_until_complete(self.http.request(method, path, json=body))


@contextlib.contextmanager
def service(artifacts: Path) -> Iterator[Client]:
    from service.http.app import create_app
    from service.http.settings import Settings

    client = Client(create_app(Settings(artifacts=artifacts, threads=1)))
    client.loop.run_until_complete(client.lifespan.__aenter__())
    try:
        yield client
    finally:
        client.loop.run_until_complete(client.http.aclose())
        client.loop.run_until_complete(client.lifespan.__aexit__(None, None, None))
        client.loop.close()


def send(client: Client, request: Request) -> dict[str, Any]:
    response = client.request(request.method, request.path, request.body)
    assert response.status_code == 200, (request, response.text)
    return dict(response.json())


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_seqrec_command_on_a_page_parses(page: Path) -> None:
    parser = build_parser()
    for command in command_lines(page, "seqrec"):
        argv = [w for w in shlex.split(command)[1:] if "$" not in w]
        try:
            args, extra = parser.parse_known_args(argv)
        except SystemExit:
            pytest.fail(f"{page.name}: {command}")
        assert not extra or getattr(args, "overrides", False), f"{page.name}: {command}: {extra}"


def _quick(config: dict[str, Any], retriever: Path) -> dict[str, Any]:
    return {**config, "retriever": str(retriever), "overrides": {**config.get("overrides", {}), **QUICK}}


def test_the_demo_tutorial(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    page = TUTORIALS / "demo.md"
    (config,) = yaml_blocks(page)
    shipped = ROOT / "configs" / "pipeline" / "demo.yaml"
    assert config == yaml.safe_load(shipped.read_text())  # the page shows the config `seqrec demo` runs
    monkeypatch.chdir(tmp_path)
    # quick: 200 of the 2,000 synthetic users, one epoch
    quick = _quick(config, ROOT / "configs" / "synthetic" / "transformer.yaml")
    quick["data"]["synthetic"]["n_users"] = 200
    Path("demo.yaml").write_text(yaml.safe_dump(quick))
    run("seqrec pipeline --config demo.yaml --out artifacts/demo --threads 1")
    with service(Path("artifacts/demo")) as client:
        answers = [send(client, r) for r in requests(page)]
    assert [len(a["items"]) for a in answers if "items" in a] == [5, 5]
    assert answers[0]["reranked"] is True
    assert answers[0]["unknown_items"] == []
    prepare, evaluate = command_lines(page, "seqrec")
    run(prepare.replace("--n-users 2000", "--n-users 200"))
    run(evaluate)


@pytest.mark.slow
def test_the_demo_as_it_ships(tmp_path: Path) -> None:
    assert main(["demo", "--no-serve", "--out", str(tmp_path / "artifacts"), "--threads", "1", "-q"]) == 0


def _log(path: Path, users: int, start: int, seed: int) -> None:
    """Events in the page's format (user,item,ts): each user walks a ring of 60 items, some steps skipped."""
    rng = np.random.default_rng(seed)
    with path.open("a", newline="") as f:
        out = csv.writer(f)
        if f.tell() == 0:
            out.writerow(["user", "item", "ts"])
        for u in range(users):
            item, t = int(rng.integers(60)), start + u * 10
            for _ in range(int(rng.integers(6, 14))):
                item = (item + int(rng.integers(1, 3))) % 60
                t += int(rng.integers(60, 600))
                out.writerow([f"user-{u}", f"sku-{item}", t])


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The own-CSV tutorial run in a folder of its own: its prepare and pipeline commands, its request."""
    page = TUTORIALS / "own-csv.md"
    work = tmp_path_factory.mktemp("shop")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(work)
        _log(Path("events.csv"), users=150, start=1_700_000_000, seed=0)
        prepare, pipeline, serve = command_lines(page, "seqrec")
        run(prepare)
        (config,) = yaml_blocks(page)
        Path("shop.yaml").write_text(yaml.safe_dump(_quick(config, ROOT / config["retriever"])))
        run(pipeline, "--threads", "1")
        artifacts = Path(vars(build_parser().parse_args(shlex.split(serve)[1:]))["artifacts"])
        with service(artifacts) as client:
            (answer,) = [send(client, r) for r in requests(page)]
    assert len(answer["items"]) == 10
    assert answer["unknown_items"] == []
    assert not {"sku-17", "sku-3"} & {i["item_id"] for i in answer["items"]}  # no repeats here: history excluded
    return work


def test_the_own_csv_tutorial(shop: Path) -> None:
    assert (shop / "data" / "shop" / "manifest.json").is_file()
    assert (shop / "artifacts" / "shop" / "current" / "ranker" / "manifest.json").is_file()


def test_the_nightly_retraining_tutorial(shop: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    page = TUTORIALS / "nightly-retraining.md"
    monkeypatch.chdir(shop)
    retrain, warm, rollback, cron = command_lines(page, "seqrec")
    assert cron == retrain  # the cron line runs the same command
    first = Path("artifacts/shop/current").resolve().name
    with service(Path("artifacts/shop")) as client:
        _log(Path("events.csv"), users=20, start=1_800_000_000, seed=1)  # the day's new events
        run(retrain, "--threads", "1")
        second = Path("artifacts/shop/current").resolve().name
        assert second != first
        (reload, _) = requests(page)
        assert send(client, reload)["model_version"] == second
        # quick: the server is this in-process app, so its reload is sent here rather than by --reload URL
        run(rollback.split(" --reload ")[0])
        assert Path("artifacts/shop/current").resolve().name == first
        assert send(client, reload)["model_version"] == first
    assert "--warm-start" in warm.split()


def test_the_docker_compose_tutorial_names_what_the_compose_file_has() -> None:
    page = TUTORIALS / "docker-compose.md"
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    text = page.read_text()
    for command in command_lines(page, "docker"):
        words = shlex.split(command)
        if "run" in words:
            service_name = next(w for w in words[words.index("run") + 1:] if not w.startswith("-") and "=" not in w)
            assert service_name in compose["services"], command
        for word in words:
            if word.startswith("api="):
                assert "api" in compose["services"]
    compose_text = (ROOT / "docker-compose.yml").read_text() + (ROOT / "docker" / "entrypoint.sh").read_text()
    for variable in ("SEQREC_API_KEY", "SEQREC_PIPELINE_CONFIG", "SEQREC_RELOAD_POLL_S", "SEQREC_RETRAIN"):
        assert variable in text, variable
        assert variable in compose_text, variable
    (rollback,) = [c for c in command_lines(page, "docker") if "rollback" in c]
    args = build_parser().parse_args(shlex.split(rollback.split(" trainer ", 1)[1])[1:])
    assert isinstance(args, argparse.Namespace)
    assert str(args.artifacts) == "/artifacts"
    assert [r.path for r in requests(page)] == ["/readyz", "/recommend", "/events", "/admin/reload"]
