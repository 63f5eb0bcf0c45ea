"""Secure by default and one client cannot hold a worker: the start-up checks (no open server off loopback, no
short key, the key file), the Host allow-list, the request-read deadline and the connection cap of `seqrec
serve` (a real server over real sockets), and every worker's log lines (level, logger, JSON)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import uvicorn

from offline.bench.lib.processes import SeqrecServeProcess, free_port
from offline.cli import main
from service.http.guards import GuardedConfig, host_allowed, host_name, without_paths
from service.http.settings import LOOPBACK_NAMES, Settings
from tests.service.support import REPO

KEY = "guards-test-key-0123456789"


def _env(tmp_path: Path, **settings: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEQREC_")}
    env.update({"SEQREC_THREADS": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)})
    env.update({f"SEQREC_{name.upper()}": value for name, value in settings.items()})
    return env


@contextmanager
def seqrec_serve(tmp_path: Path, bundle: Path, *, host: str = "127.0.0.1",
                 **settings: str) -> Iterator[SeqrecServeProcess]:
    server = SeqrecServeProcess(_env(tmp_path, artifacts=str(bundle), **settings), tmp_path / "serve.log",
                                host=host, cwd=tmp_path)
    try:
        yield server.launch().wait_ready(90.0)
    finally:
        server.stop()


# --------------------------------------------------------------------------- start-up


def test_a_keyless_server_off_loopback_refuses_to_start(bundle: Path, tmp_path: Path) -> None:
    env = _env(tmp_path, artifacts=str(bundle))
    done = subprocess.run([sys.executable, "-m", "offline.cli", "serve", "--host", "0.0.0.0", "--port", "0"],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("seqrec: error: invalid settings: refusing to listen on 0.0.0.0 without an API key")
    for way_out in ("SEQREC_API_KEY", "SEQREC_API_KEY_FILE", "--insecure-no-key", "127.0.0.1"):
        assert way_out in lines[0]


def test_the_demo_refuses_an_open_server_off_loopback_before_training(capsys: pytest.CaptureFixture,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import offline.jobs.pipeline

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("the demo trained although it could not serve")

    monkeypatch.setattr(offline.jobs.pipeline, "run_pipeline", never)
    monkeypatch.delenv("SEQREC_API_KEY", raising=False)
    monkeypatch.delenv("SEQREC_API_KEY_FILE", raising=False)
    monkeypatch.delenv("SEQREC_INSECURE_NO_KEY", raising=False)
    assert main(["demo", "--host", "0.0.0.0", "--port", "0"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("seqrec: error: invalid settings: refusing to listen on 0.0.0.0 without an API key")


def test_opting_out_and_a_key_both_start_off_loopback(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in [n for n in os.environ if n.startswith("SEQREC_")]:
        monkeypatch.delenv(name)
    assert Settings(_env_file=None, host="0.0.0.0", insecure_no_key=True).api_key_value() is None
    assert Settings(_env_file=None, host="0.0.0.0", api_key=KEY).api_key_value() == KEY
    assert Settings(_env_file=None, host="127.0.0.1").api_key_value() is None  # loopback: nobody else reaches it
    with pytest.raises(ValueError, match=r"refusing to listen on 10\.1\.2\.3 without an API key"):
        Settings(_env_file=None, host="10.1.2.3")


@pytest.mark.parametrize("key", ["k", "fifteen-chars-x"])
def test_a_short_key_is_refused_at_start(bundle: Path, key: str, capsys: pytest.CaptureFixture,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEQREC_API_KEY", key)
    assert main(["serve", "--artifacts", str(bundle)]) == 1
    err = capsys.readouterr().err.strip()
    assert err == (f"seqrec: error: invalid settings: SEQREC_API_KEY: Value error, is {len(key)} characters long; an "
                   "API key needs at least 16 (e.g. `python -c 'import secrets; print(secrets.token_urlsafe(32))'`)")
    assert Settings(_env_file=None, api_key=key + "x" * (16 - len(key))).api_key_value() is not None


def test_the_key_file_is_read_at_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("SEQREC_")]:
        monkeypatch.delenv(name)
    file = tmp_path / "api_key"
    file.write_text(KEY + "\n")  # `echo KEY > file`: the line break is not part of the key
    assert Settings(_env_file=None, api_key_file=file, host="0.0.0.0").api_key_value() == KEY
    with pytest.raises(ValueError, match="SEQREC_API_KEY and SEQREC_API_KEY_FILE are both set"):
        Settings(_env_file=None, api_key_file=file, api_key=KEY)
    file.write_text("short\n")
    with pytest.raises(ValueError, match=r"SEQREC_API_KEY_FILE: the key in .* is 5 characters long"):
        Settings(_env_file=None, api_key_file=file)
    with pytest.raises(ValueError, match=r"SEQREC_API_KEY_FILE: cannot read .*missing: No such file"):
        Settings(_env_file=None, api_key_file=tmp_path / "missing")


def test_the_host_allow_list_defaults_and_matching(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("SEQREC_")]:
        monkeypatch.delenv(name)
    assert Settings(_env_file=None).host_allow_list() == LOOPBACK_NAMES
    assert Settings(_env_file=None, api_key=KEY).host_allow_list() == ("*",)
    assert Settings(_env_file=None, host="0.0.0.0", insecure_no_key=True).host_allow_list() == ("*",)
    assert Settings(_env_file=None, allowed_hosts="api.example.com, *.corp").host_allow_list() == (
        "api.example.com", "*.corp")
    assert [host_name(h) for h in ("localhost:8000", "[::1]:8000", "[::1]", "Example.COM", "::1")] == [
        "localhost", "[::1]", "[::1]", "example.com", "::1"]
    assert host_allowed("a.corp", ("*.corp",))
    assert not host_allowed("corp", ("*.corp",))
    assert not host_allowed("evil.example", LOOPBACK_NAMES)


def test_answers_name_files_not_folders() -> None:
    assert without_paths("journal beside /srv/a/versions/v1: [Errno 13] Permission denied: '/srv/a/x.lock'") == (
        "journal beside v1: [Errno 13] Permission denied: 'x.lock'")
    assert without_paths("see https://example.com/a/b") == "see https://example.com/a/b"


# --------------------------------------------------------------------------- a real server


def _trickle(port: int, request: tuple[bytes, bytes], every_s: float, limit_s: float) -> tuple[float, bytes]:
    """Send ``request[0]`` at once, then ``request[1]`` one byte every ``every_s`` until the server answers or
    closes; (seconds, answer)."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(every_s)
        start, answer = time.monotonic(), b""
        sock.sendall(request[0])
        for byte in request[1]:
            try:
                sock.sendall(bytes([byte]))
                chunk = sock.recv(4096)
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
            answer += chunk
            if not chunk or b"\r\n\r\n" in answer:
                break
            if time.monotonic() - start > limit_s:
                break
        return time.monotonic() - start, answer


# (sent at once, then trickled): the whole header then the body, or the request line then the rest of the header
BODY_TRICKLE = (b"POST /recommend HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                b"content-length: 60\r\n\r\n", b" " * 60)
HEADER_TRICKLE = (b"GET /healthz HTTP/1.1\r\n", b"Host: 127.0.0.1\r\nX-Slow: " + b"a" * 60)


def test_a_trickling_client_is_cut_at_the_deadline_while_others_are_served(bundle: Path, tmp_path: Path) -> None:
    deadline_s, every_s = 2.0, 1.5
    with seqrec_serve(tmp_path, bundle, request_read_timeout_s=str(deadline_s)) as server:
        results: dict[str, tuple[float, bytes]] = {}
        def trickle(kind: str, request: tuple[bytes, bytes]) -> None:
            results[kind] = _trickle(server.port, request, every_s, 30.0)

        jobs = (("body", BODY_TRICKLE), ("headers", HEADER_TRICKLE))
        slow = [threading.Thread(target=trickle, args=job) for job in jobs]
        for thread in slow:
            thread.start()
        latencies, statuses = [], []
        with httpx.Client(base_url=server.url, timeout=10.0) as client:
            while any(thread.is_alive() for thread in slow):
                start = time.monotonic()
                statuses.append(client.post("/recommend", json={"history": ["i1", "i2"], "k": 5}).status_code)
                latencies.append(time.monotonic() - start)
                time.sleep(0.05)
        for thread in slow:
            thread.join()
    for kind in ("body", "headers"):
        seconds, answer = results[kind]
        assert answer.startswith(b"HTTP/1.1 408 "), (kind, answer)
        assert deadline_s - 0.1 <= seconds <= deadline_s + every_s + 1.0, (kind, seconds)
    assert statuses
    assert set(statuses) == {200}
    assert max(latencies) < deadline_s  # never waited for the slow clients
    assert "Traceback" not in server.log.read_text()


def test_the_connection_cap_answers_503_past_it(bundle: Path, tmp_path: Path) -> None:
    cap = 4
    with seqrec_serve(tmp_path, bundle, max_connections=str(cap), request_read_timeout_s="30") as server:
        idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(cap - 1)]
        try:
            time.sleep(0.3)
            with httpx.Client(base_url=server.url, timeout=10.0) as client:
                assert client.get("/healthz").status_code == 503  # the cap-th connection, with cap - 1 held
        finally:
            for sock in idle:
                sock.close()
        time.sleep(0.3)
        with httpx.Client(base_url=server.url, timeout=10.0) as client:
            assert client.get("/healthz").status_code == 200


def test_a_keyless_loopback_server_answers_its_localhost_names_only(bundle: Path, tmp_path: Path) -> None:
    with seqrec_serve(tmp_path, bundle) as server, httpx.Client(base_url=server.url, timeout=10.0) as client:
        for host in ("localhost", f"localhost:{server.port}", f"127.0.0.1:{server.port}", "[::1]:8000"):
            assert client.get("/healthz", headers={"Host": host}).status_code == 200, host
        refused = client.delete("/admin/items/i5", headers={"Host": "rebound.attacker.example"})
        assert refused.status_code == 400
        assert "SEQREC_ALLOWED_HOSTS" in refused.json()["detail"]
        assert client.get("/readyz").status_code == 200


def test_every_worker_logs_info_lines_with_level_and_logger_as_json(bundle: Path, tmp_path: Path) -> None:
    """Two workers: each one's start-up line ("serving ...", a seqrec.service info line) reaches the log."""
    with seqrec_serve(tmp_path, bundle, workers="2", log_format="json", redis_url="") as server:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            lines = [json.loads(line) for line in server.log.read_text().splitlines() if line.startswith("{")]
            serving = {e["pid"] for e in lines if e["logger"] == "seqrec.service" and e["level"] == "INFO"
                       and e["message"].startswith("serving ")}
            if len(serving) == 2:
                break
            time.sleep(0.2)
    assert len(serving) == 2, server.log.read_text()[-3000:]
    assert {"time", "level", "logger", "pid", "message"} <= set(lines[0])


# --------------------------------------------------------------------------- both protocols, in process


async def _echo(scope: dict, receive: object, send: object) -> None:
    """Reads the whole body, answers 200 with its length."""
    assert scope["type"] == "http"
    size = 0
    while True:
        message = await receive()  # type: ignore[operator]
        if message["type"] == "http.disconnect":
            return
        size += len(message.get("body", b""))
        if not message.get("more_body"):
            break
    body = str(size).encode()
    await send({"type": "http.response.start", "status": 200,  # type: ignore[operator]
                "headers": [(b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})  # type: ignore[operator]


@contextmanager
def _guarded(http: str, deadline_s: float) -> Iterator[int]:
    port = free_port()
    server = uvicorn.Server(GuardedConfig(_echo, host="127.0.0.1", port=port, http=http, lifespan="off",
                                          read_timeout_s=deadline_s, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert thread.is_alive(), "the server did not start"
            assert time.monotonic() < deadline, "the server did not start in 30 s"
            time.sleep(0.02)
        yield port
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.mark.parametrize("http", ["service.http.guards:DeadlineHttpToolsProtocol",
                                  "service.http.guards:DeadlineH11Protocol"])
def test_each_protocol_cuts_a_slow_request_and_only_a_slow_one(http: str) -> None:
    deadline_s, every_s = 0.6, 0.25
    with _guarded(http, deadline_s) as port:
        for request in (BODY_TRICKLE, HEADER_TRICKLE, (b"", b"GET / HTTP/1.1\r\n")):  # the last: from the opening
            seconds, answer = _trickle(port, request, every_s, 10.0)
            assert answer.startswith(b"HTTP/1.1 408 "), (request, answer)
            assert deadline_s - 0.05 <= seconds <= deadline_s + every_s + 0.5, seconds
        with socket.create_connection(("127.0.0.1", port)) as sock:  # keep-alive: the deadline is per request
            sock.settimeout(5)
            for _ in range(2):
                sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\ncontent-length: 3\r\n\r\nabc")
                assert sock.recv(4096).startswith(b"HTTP/1.1 200 ")
                time.sleep(deadline_s * 2)  # idle between requests is uvicorn's keep-alive (5 s), not the deadline
