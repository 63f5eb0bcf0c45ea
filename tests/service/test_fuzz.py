"""Schema fuzzing: schemathesis, driven by the service's own /openapi.json, against a real uvicorn server.

Every operation is fuzzed with requests that fit the schema and requests that break it (boundary values from the
coverage phase, then Hypothesis-generated ones), with every schemathesis check on: no 5xx, only documented status
codes, content types and headers, bodies valid against the documented schemas, schema-breaking requests rejected
with a 4xx, schema-valid ones accepted, auth enforced where the schema declares it. The server's own request counter
(/metrics) says how many requests were sent and what they got.

    pytest tests/service/test_fuzz.py            # fast: ~400 requests
    pytest tests/service/test_fuzz.py -m slow    # >= 1,000 requests, figures printed
    SEQREC_FUZZ_OUT=docs/results/reliability/fuzz.json pytest tests/service/test_fuzz.py -m slow -s
                                                 # ... and written to that file, with the command (FUZZ_OUT)
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from common.atomic import write_json
from offline.bench.faults.reliability import Started
from tests.service.support import Server, serving

KEY = "fuzz-key-0123456789ab"
AUTH = {"Authorization": f"Bearer {KEY}"}
FUZZ_OUT = "SEQREC_FUZZ_OUT"  # a file for the slow run's counts (docs/results/reliability/fuzz.json is one)


@dataclass(frozen=True)
class Run:
    """One `schemathesis run`: who is asked, with what, how much."""

    name: str
    key: str | None  # the Bearer key sent, if any
    phases: str
    examples: int  # the most Hypothesis-generated cases per operation (fuzzing phase)
    seed: int
    exclude_checks: tuple[str, ...] = ()
    open_server: bool = False  # against a server without SEQREC_API_KEY (else the module's keyed one)


@pytest.fixture(scope="module")
def keyed(bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Its own server with SEQREC_API_KEY set: the fuzzer's events and deletes touch no other module's users, and
    its catalogue changes (POST/DELETE /admin/items) go to its own copy of the bundle."""
    root = tmp_path_factory.mktemp("fuzz-keyed")
    copy = shutil.copytree(bundle, root / "bundle")
    with serving(root, artifacts=str(copy), api_key=KEY) as server:
        yield server


def request_counts(server: Server) -> Counter[tuple[str, int]]:
    """``(route, status) -> requests`` from the server's own counter (route "unmatched" for unknown paths)."""
    text = httpx.get(f"{server.url}/metrics", timeout=10.0).text
    counts: Counter[tuple[str, int]] = Counter()
    for line in text.splitlines():
        match = re.fullmatch(r'seqrec_requests_total\{(.*)\}\s+(\S+)', line)
        if match:
            labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(1)))
            counts[(f"{labels['method']} {labels['route']}", int(labels["status"]))] += int(float(match.group(2)))
    return counts


def fuzz(server: Server, run: Run, workdir: Path) -> Counter[tuple[str, int]]:
    """Run schemathesis against ``server``; fail with its report on any finding; return the requests it sent
    (by route and status) as the server counted them."""
    if importlib.util.find_spec("schemathesis") is None:
        pytest.fail("schemathesis is not installed: pip install -e '.[dev]'")
    before = request_counts(server)
    command = [
        sys.executable, "-m", "schemathesis.cli", "run", f"{server.url}/openapi.json",
        "--checks", "all", "--phases", run.phases, "--max-examples", str(run.examples), "--seed", str(run.seed),
        "--generation-database", "none", "--no-color", "--request-timeout", "30",
    ]
    if run.exclude_checks:
        command += ["--exclude-checks", ",".join(run.exclude_checks)]
    if run.key is not None:
        command += ["--header", f"Authorization: Bearer {run.key}"]
    workdir.mkdir(parents=True, exist_ok=True)  # schemathesis keeps a cache in its working directory
    # ...and reads its config from there. A generated body past the 1 MiB limit is refused with 413 before it is
    # parsed; the schema cannot state a byte limit, so a 413 counts as rejecting invalid data (schemathesis'
    # default list, plus 413). Valid data still has to be accepted: 413 is not added to that check.
    (workdir / "schemathesis.toml").write_text(
        '[checks.negative_data_rejection]\nexpected-statuses = ["400", "401", "403", "404", "405", "406", "409", '
        '"413", "415", "422", "428", "429", "5xx"]\n')
    result = subprocess.run(command, cwd=workdir, capture_output=True, text=True, timeout=600, check=False)
    report = result.stdout + result.stderr
    (workdir / "report.txt").write_text(report)  # whole: a huge generated body can fill the tail below
    assert result.returncode == 0, (f"schemathesis ({run.name}) found problems (whole report: "
                                    f"{workdir / 'report.txt'}):\n{report[-20_000:]}")
    after = request_counts(server)
    sent = after - before
    sent[("GET /metrics", 200)] -= 1  # the `before` read itself
    return +sent


def by_status(counts: Counter[tuple[str, int]]) -> Counter[int]:
    statuses: Counter[int] = Counter()
    for (_, status), n in counts.items():
        statuses[status] += n
    return statuses


def _summary(name: str, counts: Counter[tuple[str, int]]) -> str:
    return f"{name}: {sum(counts.values())} requests, by status {dict(sorted(by_status(counts).items()))}"


def assert_no_server_errors(counts: Counter[tuple[str, int]]) -> None:
    errors = {key: n for key, n in counts.items() if key[1] >= 500}
    assert not errors, f"answers >= 500: {errors}"


FAST = [
    Run("with the key", KEY, "coverage,fuzzing", examples=8, seed=1),
    Run("without the key", None, "fuzzing", examples=10, seed=2),
]


@pytest.mark.parametrize("run", FAST, ids=[r.name for r in FAST])
def test_fuzz_fast(keyed: Server, run: Run, tmp_path: Path) -> None:
    counts = fuzz(keyed, run, tmp_path)
    assert_no_server_errors(counts)
    statuses = by_status(counts)
    print(_summary(run.name, counts))
    assert sum(statuses.values()) >= 50, counts
    assert statuses[200] > 0, statuses  # valid requests got through
    assert statuses[422] > 0, statuses  # invalid ones reached validation
    fuzzed = {route for route, _ in counts}
    for route in ("POST /recommend", "POST /events", "GET /users/{user_id}/history",
                  "DELETE /users/{user_id}/history", "GET /items/{item_id}", "POST /admin/reload"):
        assert route in fuzzed, (route, sorted(fuzzed))
    guarded = {key: n for key, n in counts.items()
               if key[0] in ("POST /events", "POST /admin/reload", "GET /users/{user_id}/history")}
    if run.key is None:  # no write nor history read without the key (a body that is not even text gets its 400 first)
        assert all(status in (400, 401) for _, status in guarded), guarded
    else:
        assert any(status == 200 for _, status in guarded), guarded  # the guarded paths ran


SLOW = [
    Run("keyed server, key sent", KEY, "examples,coverage,fuzzing,stateful", examples=120, seed=11),
    Run("keyed server, no key", None, "coverage,fuzzing", examples=40, seed=12),
    # declared auth is not enforced where no key is set, so schemathesis' `ignored_auth` check does not apply
    Run("open server (no key set)", None, "coverage,fuzzing", examples=60, seed=13, exclude_checks=("ignored_auth",),
        open_server=True),
]


def _statuses(counts: Counter[int]) -> dict[str, int]:
    return {str(status): n for status, n in sorted(counts.items())}


def fuzz_record(command: str, runs: Sequence[tuple[Run, Counter[tuple[str, int]]]],
                operations: Mapping[str, Counter[int]], started: Started) -> dict[str, Any]:
    """What `FUZZ_OUT` receives: each run's requests by status, the totals, and each operation's. It is written only
    once every run passed (schemathesis found nothing, no answer >= 500), so both counts are 0 by then."""
    totals = sum((counts for _, counts in runs), Counter[tuple[str, int]]())
    return {
        "command": command, "date": datetime.now(UTC).isoformat(timespec="seconds"), **started.head(),
        "runs": [{"name": run.name, "key_sent": run.key is not None, "open_server": run.open_server,
                  "phases": run.phases, "max_examples": run.examples, "seed": run.seed,
                  "requests": sum(counts.values()), "by_status": _statuses(by_status(counts))} for run, counts in runs],
        "requests": sum(totals.values()), "by_status": _statuses(by_status(totals)),
        "responses_5xx": sum(n for (_, status), n in totals.items() if status >= 500), "schemathesis_findings": 0,
        "operations": {name: {"requests": sum(statuses.values()), "by_status": _statuses(statuses)}
                       for name, statuses in operations.items()},
    }


@pytest.mark.slow
def test_fuzz_thousands(keyed: Server, bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                        request: pytest.FixtureRequest) -> None:
    """>= 1,000 requests over every operation: every phase with the key, then without it, then against a server
    that has no key at all. With SEQREC_FUZZ_OUT=FILE the counts are also written to FILE (`fuzz_record`)."""
    started = Started()
    runs = []
    for run in SLOW:
        workdir = tmp_path / f"seed-{run.seed}"
        if run.open_server:
            copy = shutil.copytree(bundle, workdir / "bundle")  # its catalogue changes stay in the copy
            with serving(workdir / "server", artifacts=str(copy)) as server:
                runs.append((run, fuzz(server, run, workdir)))
        else:
            runs.append((run, fuzz(keyed, run, workdir)))
    totals = sum((counts for _, counts in runs), Counter[tuple[str, int]]())

    assert_no_server_errors(totals)
    assert sum(totals.values()) >= 1000, totals
    paths = httpx.get(f"{keyed.url}/openapi.json", timeout=10.0).json()["paths"]
    operations = {f"{method.upper()} {path}": Counter[int]() for path, ops in paths.items() for method in ops}
    other = "other (the schema itself, unsupported methods, unknown paths)"
    operations[other] = Counter()
    for (route, status), n in totals.items():
        operations[route if route in operations else other][status] += n
    with capsys.disabled():
        print("\nschema fuzzing:", *(_summary(run.name, counts) for run, counts in runs),
              _summary("total", totals), sep="\n  ")
        for name, statuses in operations.items():
            print(f"    {name}: {sum(statuses.values())} requests, {dict(sorted(statuses.items()))}")
    if out := os.environ.get(FUZZ_OUT):
        command = shlex.join([f"{FUZZ_OUT}={out}", "pytest", *request.config.invocation_params.args])
        write_json(Path(out), fuzz_record(command, runs, operations, started))


def test_the_slow_runs_counts_are_written_as_the_docs_read_them(tmp_path: Path) -> None:
    """docs/RELIABILITY.md row 1 quotes these keys of docs/results/reliability/fuzz.json."""
    runs = [(SLOW[0], Counter({("POST /recommend", 200): 5, ("GET /items", 422): 2})),
            (SLOW[1], Counter({("POST /events", 401): 3}))]
    operations = {"GET /items": Counter({422: 2}), "POST /recommend": Counter({200: 5})}
    out = tmp_path / "deeper" / "fuzz.json"
    command = f"{FUZZ_OUT}={out} pytest tests/service/test_fuzz.py -m slow -s"
    write_json(out, fuzz_record(command, runs, operations, Started()))
    record = json.loads(out.read_text())
    assert shlex.split(record["command"])[:3] == [f"{FUZZ_OUT}={out}", "pytest", "tests/service/test_fuzz.py"]
    assert (record["requests"], record["by_status"]) == (10, {"200": 5, "401": 3, "422": 2})
    assert (record["responses_5xx"], record["schemathesis_findings"]) == (0, 0)
    assert [r["requests"] for r in record["runs"]] == [7, 3]
    assert record["operations"]["GET /items"] == {"requests": 2, "by_status": {"422": 2}}
    assert record["machine"]["cpus"] == os.cpu_count()
    assert record["date"]
    assert not [p.name for p in out.parent.iterdir() if p != out]  # written through a temp file, renamed


# What the fuzzer found, pinned down (each was a schema violation or a 404 before the fix in service/http/app.py).


@pytest.fixture(scope="module")
def client(keyed: Server) -> Iterator[httpx.Client]:
    with keyed.client(headers=AUTH) as c:
        yield c


@pytest.mark.parametrize("suffix", ["a/b", "line\nbreak", "tab\tand space", "per%cent", "  "])
def test_any_user_id_reaches_its_history(client: httpx.Client, suffix: str) -> None:
    """Ids arrive unrestricted in JSON bodies; their history must be readable and deletable by path."""
    user = f"{uuid.uuid4().hex[:8]}-{suffix}"
    assert client.post("/events", json={"user_id": user, "item_id": "i1"}).status_code == 200
    path = f"/users/{quote(user, safe='')}/history"
    response = client.get(path)
    assert response.status_code == 200, response.text
    assert response.json() == {"user_id": user, "items": [{"item_id": "i1"}]}
    assert client.delete(path).json() == {"user_id": user, "deleted": True}
    assert client.get(path).json()["items"] == []


def test_item_ids_with_a_slash_are_looked_up(client: httpx.Client) -> None:
    response = client.get("/items/" + quote("no/such item", safe=""))
    assert response.status_code == 404
    assert "'no/such item'" in response.json()["detail"]
    assert client.get("/items/i1").json()["item_id"] == "i1"


@pytest.mark.parametrize(("body", "field"), [
    ({"history": ["i1"], "rerank": 0}, "rerank"),
    ({"history": ["i1"], "exclude_seen": "yes"}, "exclude_seen"),
    ({"history": ["i1"], "personalize": 1}, "personalize"),
    ({"history": ["i1"], "k": "10"}, "k"),
    ({"history": ["i1"], "k": 10.5}, "k"),
    ({"history": ["i1"], "k": True}, "k"),
])
def test_recommend_takes_no_coerced_values(client: httpx.Client, body: dict[str, object], field: str) -> None:
    response = client.post("/recommend", json=body)
    assert response.status_code == 422, response.text
    assert [e["field"] for e in response.json()["errors"]] == [field]


def test_what_the_schema_allows_is_accepted(client: httpx.Client) -> None:
    # JSON Schema counts 5.0 as an integer; item ids are documented as strings or integers.
    answer = client.post("/recommend", json={"history": ["i1", 2], "k": 5.0, "candidates": 20.0})
    assert answer.status_code == 200, answer.text
    assert len(answer.json()["items"]) == 5
    assert answer.json()["unknown_items"] == ["2"]


def test_event_timestamps_take_no_booleans(client: httpx.Client) -> None:
    """`"timestamp": false` used to be stored as 1970-01-01."""
    response = client.post("/events", json={"user_id": "u-bool", "item_id": "i1", "timestamp": False})
    assert response.status_code == 422
    assert response.json()["errors"][0]["field"] == "EventIn.timestamp"


def test_method_not_allowed_lists_every_method(client: httpx.Client) -> None:
    response = client.request("PUT", "/users/someone/history")
    assert response.status_code == 405
    assert response.headers["allow"] == "DELETE, GET, HEAD"
    assert client.request("PATCH", "/recommend").headers["allow"] == "POST"
    # the docs and the page's static files sent an empty Allow
    for method, path in (("OPTIONS", "/docs"), ("POST", "/openapi.json"), ("OPTIONS", "/static/app.js")):
        response = client.request(method, path)
        assert (response.status_code, response.headers["allow"]) == (405, "GET, HEAD"), path


def test_head_is_answered_wherever_get_is(client: httpx.Client) -> None:
    """HEAD /healthz, a load balancer's usual probe, was a 405 (RFC 9110: a server that supports GET supports HEAD)."""
    for path in ("/healthz", "/readyz", "/metrics", "/", "/items?query=i1", "/items/i1", "/users/someone/history",
                 "/docs", "/static/app.js"):
        get, head = client.get(path), client.head(path)
        assert (head.status_code, head.content) == (get.status_code, b""), path
        assert head.headers["content-type"] == get.headers["content-type"], path
    assert client.head("/items/no-such-item").status_code == 404
    assert client.head("/recommend").status_code == 405


def test_the_schema_documents_the_error_answers(client: httpx.Client) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    documented = {(method.upper(), path): set(op["responses"]) for path, ops in paths.items()
                  for method, op in ops.items()}
    assert documented[("POST", "/recommend")] == {"200", "400", "401", "409", "413", "422", "503"}  # 401: user_id
    assert documented[("POST", "/events")] == {"200", "400", "401", "409", "413", "422", "503"}
    assert documented[("GET", "/users/{user_id}/history")] == {"200", "401", "409", "422", "503"}
    assert documented[("DELETE", "/users/{user_id}/history")] == {"200", "401", "422", "503"}
    assert documented[("GET", "/items/{item_id}")] == {"200", "404", "422"}
    assert documented[("POST", "/admin/reload")] == {"200", "401", "409", "413"}
    assert documented[("POST", "/admin/items")] == {"200", "400", "401", "409", "413", "422", "503"}
    assert documented[("DELETE", "/admin/items/{item_id}")] == {"200", "401", "404", "422", "503"}
    security = {(m.upper(), p) for p, ops in paths.items() for m, op in ops.items() if op.get("security")}
    assert security == {("POST", "/events"), ("GET", "/users/{user_id}/history"),
                        ("DELETE", "/users/{user_id}/history"), ("POST", "/admin/reload"), ("POST", "/admin/items"),
                        ("DELETE", "/admin/items/{item_id}"), ("POST", "/recommend")}
    # the key or none (`{}`): a recommendation by history alone needs no key, one by user_id does
    assert paths["/recommend"]["post"]["security"] == [{"HTTPBearer": []}, {}]


def test_an_open_server_documents_open_writes(api: Server) -> None:
    """No SEQREC_API_KEY: writes need nothing, and the schema declares no auth and no 401."""
    document = httpx.get(f"{api.url}/openapi.json", timeout=10.0).json()
    operations = [op for ops in document["paths"].values() for op in ops.values()]
    assert not any(op.get("security") for op in operations)
    assert not any("401" in op["responses"] for op in operations)
    assert "securitySchemes" not in document.get("components", {})
