"""The load balancer's docker/nginx.conf: read with crossplane and checked against the api (upstream,
DNS, body limit, keepalive, retries, headers); where nginx is installed, checked with `nginx -t` and run
in front of local HTTP servers. Each check runs on the real file (expecting no problem) and on broken
copies (expecting the breakage named), so a check that can no longer fail shows up."""

from __future__ import annotations

import re
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from offline.bench.serve import replicas
from service.http.settings import Settings
from tests import needs
from tests.docker.support import (
    COMPOSE,
    NGINX_CONF,
    Directive,
    body_limit,
    compose_config,
    image_version,
    nginx_size,
    parse_nginx,
    volumes,
)

DOCKER_DNS = "127.0.0.11"
# nginx CHANGES, 1.27.3: "the "server" directive in the "upstream" block supports the "resolve" parameter".
RESOLVE_SINCE = (1, 27, 3)


def upstream_problems(directives: list[Directive], image: str) -> list[str]:
    """Every proxy_pass reaches api:8000, re-resolved through Docker's DNS, on an nginx that can."""
    problems = []

    def named(name: str) -> list[Directive]:
        return [d for d in directives if d.name == name]

    upstreams: dict[str, list[Directive]] = {}
    for d in named("server"):
        if d.block and d.block[-1].startswith("upstream "):
            upstreams.setdefault(d.block[-1].split()[1], []).append(d)
    passes = [d.args[0].removeprefix("http://") for d in named("proxy_pass")]
    targets = {s.args[0] for p in passes for s in upstreams.get(p, [])} | {p for p in passes if p not in upstreams}
    if not passes or targets != {"api:8000"}:
        problems.append(f"proxies to {sorted(targets)}, not api:8000")
    if not any(DOCKER_DNS in d.args for d in named("resolver")):
        problems.append(f"no resolver {DOCKER_DNS} (Docker's DNS, which knows every replica)")
    resolved = [s for group in upstreams.values() for s in group if "resolve" in s.args]
    if not resolved and not any("$" in p for p in passes):
        problems.append("api is resolved once at start-up (no `resolve`, no variable in proxy_pass): "
                        "replicas started later get no traffic")
    for group in {s.block for s in resolved}:
        if not any(d.name == "zone" and d.block == group for d in directives):
            problems.append(f"{group[-1]} resolves without a zone (`resolve` needs the shared memory)")
    version = image_version(image)
    if resolved and (version is None or version < RESOLVE_SINCE):
        problems.append(f"{image}: `server ... resolve` needs nginx 1.27.3 or later")
    return problems


def proxy_problems(directives: list[Directive], limit: int) -> list[str]:
    """Body limit, keepalive to the replicas, safe retries, and the headers every replica gets."""
    problems = []

    def named(name: str) -> list[Directive]:
        return [d for d in directives if d.name == name]

    sizes = [nginx_size(d.args[0]) for d in named("client_max_body_size")]
    if sizes != [limit]:
        problems.append(f"client_max_body_size is {sizes} bytes, not the service's {limit}")
    keepalive = [d for d in named("keepalive") if d.block and d.block[-1].startswith("upstream ")]
    if not keepalive or [d.args for d in named("proxy_http_version")] != [("1.1",)] \
            or not any(d.args == ("Connection", "") for d in named("proxy_set_header")):
        problems.append('no keepalive to the replicas (upstream keepalive, proxy_http_version 1.1, Connection "")')
    retries = named("proxy_next_upstream")
    if not retries or not all({"error", "timeout"} <= set(d.args) for d in retries):
        problems.append("proxy_next_upstream does not move on to another replica on error and timeout")
    for d in retries:
        if "non_idempotent" in d.args and d.block[-1:] != ("location = /recommend",):
            problems.append(f"non_idempotent retries in {d.block[-1]}: a retried POST /events would store twice")
    headers = named("proxy_set_header")
    for header in ("X-Request-ID", "X-Forwarded-For"):
        if not any(d.args[0].lower() == header.lower() for d in headers):
            problems.append(f"{header} is not passed to the replicas")
    if len({d.block for d in headers}) > 1:  # nginx: a block with its own proxy_set_header inherits none
        problems.append("proxy_set_header in more than one block: the inner one drops the outer headers")
    return problems


MAX_READ_TIMEOUT_S = 60  # nginx's own default; a slow client holds a connection at most this long per read


def seconds(value: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    number, unit = re.fullmatch(r"(\d+)(ms|s|m|h)?", value).groups()  # type: ignore[union-attr]
    return int(number) * units[unit or "s"]


def limits_problems(directives: list[Directive]) -> list[str]:
    """One client cannot hold the lb: header and body read timeouts set at the http level (their defaults are
    60 s), and a per-address connection limit whose zone exists."""
    problems = []
    http = [d for d in directives if d.block == ("http",)]
    for name in ("client_header_timeout", "client_body_timeout", "send_timeout"):
        set_to = [seconds(d.args[0]) for d in http if d.name == name]
        if not set_to or set_to[0] >= MAX_READ_TIMEOUT_S:
            problems.append(f"{name} is {set_to or 'unset'} (nginx's default 60 s), not below {MAX_READ_TIMEOUT_S} s")
    zones = {arg.split("=", 1)[1].split(":")[0] for d in http if d.name == "limit_conn_zone" for arg in d.args
             if arg.startswith("zone=")}
    keyed = {d.args[0] for d in http if d.name == "limit_conn_zone" and d.args[0] == "$binary_remote_addr"}
    limits = [d for d in directives if d.name == "limit_conn"]
    if not keyed or not limits or any(d.args[0] not in zones for d in limits):
        problems.append("no limit_conn on a zone keyed by the client's address ($binary_remote_addr)")
    return problems


def nginx_problems(text: str, limit: int, image: str, tmp_path: Path) -> list[str]:
    directives = parse_nginx(text, tmp_path)
    return upstream_problems(directives, image) + proxy_problems(directives, limit) + limits_problems(directives)


# --- the real file -------------------------------------------------------------------------------

def test_lb_config_proxies_to_every_api_replica(tmp_path):
    compose = compose_config(COMPOSE)
    lb = compose["services"]["lb"]
    assert volumes(lb, "bind") == {"docker/nginx.conf": ("/etc/nginx/nginx.conf", True)}
    assert NGINX_CONF.is_file()
    assert nginx_problems(NGINX_CONF.read_text(), body_limit(compose), lb["image"], tmp_path) == []


def test_lb_body_limit_is_the_services_own(tmp_path):
    compose = compose_config(COMPOSE)
    assert body_limit(compose) == Settings(_env_file=None).max_body_bytes  # compose leaves the default
    sizes = [d.args[0] for d in parse_nginx(NGINX_CONF.read_text(), tmp_path) if d.name == "client_max_body_size"]
    assert [nginx_size(size) for size in sizes] == [body_limit(compose)]
    compose["services"]["api"]["environment"]["SEQREC_MAX_BODY_BYTES"] = str(2 << 20)
    assert body_limit(compose) == 2 << 20
    problems = nginx_problems(NGINX_CONF.read_text(), body_limit(compose), compose["services"]["lb"]["image"], tmp_path)
    assert any("client_max_body_size" in p for p in problems)


def test_nginx_parser_and_sizes(tmp_path):
    text = """
    # a comment; with { braces }
    http {
        resolver 127.0.0.11 valid=10s;  # trailing comment
        upstream api { server api:8000 resolve; }
        log_format x '$a "b" ;{}';
        server { location = /recommend { proxy_set_header Connection ""; } }
    }
    """
    assert parse_nginx(text, tmp_path) == [
        Directive((), "http", ()),
        Directive(("http",), "resolver", ("127.0.0.11", "valid=10s")),
        Directive(("http",), "upstream", ("api",)),
        Directive(("http", "upstream api"), "server", ("api:8000", "resolve")),
        Directive(("http",), "log_format", ("x", '$a "b" ;{}')),
        Directive(("http",), "server", ()),
        Directive(("http", "server"), "location", ("=", "/recommend")),
        Directive(("http", "server", "location = /recommend"), "proxy_set_header", ("Connection", "")),
    ]
    with pytest.raises(ValueError, match="cannot parse"):
        parse_nginx("http { server {\n", tmp_path)
    assert [nginx_size(s) for s in ("1m", "1M", "512k", "1048576", "1g")] == [1 << 20, 1 << 20, 512 << 10, 1 << 20,
                                                                             1 << 30]
    assert image_version("nginx:1.30-alpine") == (1, 30, 999)
    assert image_version("nginx:1.27.2-alpine") == (1, 27, 2)
    assert image_version("nginx:latest") is None
    assert image_version("nginx") is None


# --- the checks fail on broken copies ------------------------------------------------------------

NGINX_BREAKAGES = [
    ("server api:8000 resolve;", "server web:8000 resolve;", "not api:8000"),
    ("resolver 127.0.0.11 valid=10s ipv6=off;", "", "no resolver 127.0.0.11"),
    ("server api:8000 resolve;", "server api:8000;", "resolved once at start-up"),
    ("zone api 64k;", "", "without a zone"),
    ("client_max_body_size 1m;", "client_max_body_size 10m;", "client_max_body_size"),
    ("keepalive 32;", "", "no keepalive"),
    ('proxy_set_header Connection "";', "", "no keepalive"),
    ("proxy_next_upstream error timeout;", "proxy_next_upstream off;", "error and timeout"),
    ("proxy_pass http://api;\n            add_header", "proxy_pass http://api;\n"
     "            proxy_next_upstream error timeout non_idempotent;\n            add_header", "non_idempotent retries"),
    ("proxy_set_header X-Request-ID $seqrec_request_id;", "", "X-Request-ID is not passed"),
    ("proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;", "", "X-Forwarded-For is not passed"),
    ("location / {", "location / {\n            proxy_set_header Host $host;", "drops the outer headers"),
    ("client_header_timeout 10s;", "", "client_header_timeout is unset"),
    ("client_body_timeout 10s;", "client_body_timeout 2m;", "client_body_timeout is [120]"),
    ("send_timeout 10s;", "", "send_timeout is unset"),
    ("limit_conn per_client 64;", "", "no limit_conn"),
    ("limit_conn per_client 64;", "limit_conn other 64;", "no limit_conn"),
]


@pytest.mark.parametrize(("old", "new", "expected"), NGINX_BREAKAGES, ids=[e for _, _, e in NGINX_BREAKAGES])
def test_nginx_check_catches(old, new, expected, tmp_path):
    compose = compose_config(COMPOSE)
    text = NGINX_CONF.read_text()
    assert old in text, f"the breakage no longer applies: {old!r} is not in docker/nginx.conf"
    problems = nginx_problems(text.replace(old, new, 1), body_limit(compose), compose["services"]["lb"]["image"],
                              tmp_path)
    assert any(expected in problem for problem in problems), problems


def test_nginx_check_catches_resolve_on_an_nginx_without_it(tmp_path):
    problems = nginx_problems(NGINX_CONF.read_text(), body_limit(compose_config(COMPOSE)), "nginx:1.26-alpine",
                              tmp_path)
    assert any("needs nginx 1.27.3" in problem for problem in problems)


# --- nginx for real (where installed) ------------------------------------------------------------

def test_bench_runs_docker_nginx_conf_with_only_the_servers_replaced(tmp_path):
    local = replicas.local_nginx_config(NGINX_CONF.read_text(), ["127.0.0.1:1", "127.0.0.1:2"], "127.0.0.1:3",
                                        tmp_path)
    original, derived = parse_nginx(NGINX_CONF.read_text(), tmp_path), parse_nginx(local, tmp_path)

    def upstream_servers(directives: list[Directive]) -> list[tuple[str, ...]]:
        return [d.args for d in directives if d.name == "server" and d.block[-1:] == ("upstream api",)]

    def rest(directives: list[Directive]) -> list[Directive]:
        return [d for d in directives if d.name not in ("listen", "resolver") and not d.name.endswith("_temp_path")
                and not (d.name == "server" and d.block[-1:] == ("upstream api",))]

    assert rest(derived) == rest(original)
    assert upstream_servers(original) == [("api:8000", "resolve")]
    assert upstream_servers(derived) == [("127.0.0.1:1",), ("127.0.0.1:2",)]
    assert [d.args for d in derived if d.name == "listen"] == [("127.0.0.1:3",)]
    assert [d.args[0] for d in derived if d.name == "resolver"] == ["127.0.0.1"]
    with pytest.raises(ValueError, match="expected one line"):
        replicas.local_nginx_config("http {\n}\n", ["127.0.0.1:1"], "127.0.0.1:3", tmp_path)


def test_nginx_accepts_the_config(tmp_path):
    needs.program("nginx")
    # `api` and 127.0.0.11 exist only on the compose network; an nginx older than 1.27.3 (Debian 12 has
    # 1.22) rejects `resolve`, so it checks everything else.
    resolve = replicas.nginx_version() >= RESOLVE_SINCE
    conf = tmp_path / "nginx.conf"
    server = "localhost:8000" if resolve else "127.0.0.1:8000"
    conf.write_text(replicas.local_nginx_config(NGINX_CONF.read_text(), [server], "127.0.0.1:8000", tmp_path,
                                                resolve=resolve))
    checked = subprocess.run([*replicas.nginx_command(conf, tmp_path), "-t"], capture_output=True, text=True,
                             timeout=30, check=False)
    assert checked.returncode == 0, checked.stderr
    assert "test is successful" in checked.stderr


@pytest.fixture
def echo_server() -> Iterator[tuple[str, list[tuple[str, str, dict[str, str]]]]]:
    """An HTTP/1.1 server answering 200 to GET and POST; yields its address and the (method, path,
    headers) of every request it got."""
    seen: list[tuple[str, str, dict[str, str]]] = []

    class Echo(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as nginx's upstream keepalive expects

        def answer(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen.append((self.command, self.path, {k.lower(): v for k, v in self.headers.items()}))
            body = b'{"status": "ready"}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = answer

        def log_message(self, format: str, *args: Any) -> None:  # quiet: no line per request on stderr
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def call(url: str, method: str = "GET", body: bytes | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, dict[str, str]]:
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=10) as response:
            response.read()
            return response.status, dict(response.headers)
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers)


def test_nginx_skips_a_dead_replica_passes_ids_and_enforces_the_body_limit(echo_server):
    needs.program("nginx")
    address, seen = echo_server
    # nothing listens there, so every connection is refused; max_fails=0 keeps nginx sending it its
    # round-robin share instead of setting it aside after the first failure
    dead = f"127.0.0.1:{replicas.free_port()} max_fails=0"
    limit = body_limit(compose_config(COMPOSE))
    with replicas.start_nginx([dead, address]) as url:
        # every request reaches the live replica, POSTs included: a refused connection never sent them
        for method, path in [("POST", "/recommend"), ("POST", "/events"), ("GET", "/readyz")] * 2:
            status, _ = call(url + path, method, b"{}" if method == "POST" else None)
            assert status == 200, (method, path)

        status, headers = call(url + "/recommend", "POST", b"{}", {"X-Request-ID": "req-42",
                                                                  "X-Forwarded-For": "203.0.113.7"})
        got = seen[-1][2]
        assert (status, headers["X-Request-ID"], got["x-request-id"]) == (200, "req-42", "req-42")
        assert got["x-forwarded-for"] == "203.0.113.7, 127.0.0.1"

        status, headers = call(url + "/items")
        made_up = seen[-1][2]["x-request-id"]
        assert re.fullmatch(r"[0-9a-f]{32}", made_up)
        assert headers["X-Request-ID"] == made_up

        n_seen = len(seen)
        assert call(url + "/events", "POST", b" " * limit)[0] == 200
        assert call(url + "/events", "POST", b" " * (limit + 1))[0] == 413
        assert len(seen) == n_seen + 1  # the body over the limit never reached a replica
