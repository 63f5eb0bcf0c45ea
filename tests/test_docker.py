"""Static checks of the Docker files; there is no Docker engine on the development machine or in CI.

Each check is a function returning the problems it finds, run on the real files (expecting none)
and on broken copies (expecting the breakage named), so a check that can no longer fail shows up.
The entrypoint's `once` guard is run for real with /bin/sh; where nginx is installed, the load
balancer's docker/nginx.conf is checked with `nginx -t` and run in front of two local HTTP servers.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import re
import shlex
import shutil
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from offline.cli import main as seqrec_main
from service.settings import Settings

REPO = Path(__file__).resolve().parents[1]
COMPOSE = REPO / "docker-compose.yml"
COMPOSE_GPU = REPO / "docker-compose.gpu.yml"
DOCKERFILES = {"cpu": REPO / "docker" / "Dockerfile", "gpu": REPO / "docker" / "Dockerfile.gpu"}
ENTRYPOINT = REPO / "docker" / "entrypoint.sh"
DOCS = REPO / "docs" / "DOCKER.md"
NGINX_CONF = REPO / "docker" / "nginx.conf"
LB_CONF_TARGET = "/etc/nginx/nginx.conf"
DOCKER_DNS = "127.0.0.11"
# nginx CHANGES, 1.27.3: "the "server" directive in the "upstream" block supports the "resolve" parameter".
RESOLVE_SINCE = (1, 27, 3)

SETTINGS_VARIABLES = {"SEQREC_" + name.upper() for name in Settings.model_fields}
# Variables the trainer container reads that are not service settings, with the files that read them
# (checked below, so the list cannot outlive the code).
TRAINER_VARIABLES = {
    "SEQREC_CACHE": "offline/**/*.py",
    "SEQREC_MOVIELENS_URL": "offline/**/*.py",
    "SEQREC_PIPELINE_CONFIG": "offline/**/*.py",
    "SEQREC_RETRAIN": "docker/entrypoint.sh",
}
COMPILERS = re.compile(r"(?<![\w-])(build-essential|gcc|g\+\+|clang|cmake|make|python3(\.\d+)?-dev)(?![\w-])")
ROOT_USERS = {"root", "0"}


# --- compose ---------------------------------------------------------------------------------

def interpolate(value: Any) -> Any:
    """Compose's ${VAR:-default} / ${VAR-default} / ${VAR} with every VAR unset."""
    if isinstance(value, str):
        return re.sub(r"\$\{\w+(?::?-([^}]*))?\}", lambda m: m.group(1) or "", value)
    if isinstance(value, dict):
        return {k: interpolate(v) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v) for v in value]
    return value


def merge(base: Any, override: Any) -> Any:
    """Compose's merge of an override file: mappings merge, anything else is replaced."""
    if isinstance(base, dict) and isinstance(override, dict):
        return {k: merge(base[k], v) if k in base else v for k, v in override.items()} | {
            k: v for k, v in base.items() if k not in override}
    return override


def load_compose(*paths: Path) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for path in paths:
        data = merge(data, yaml.safe_load(path.read_text()))
    return interpolate(data)


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {str(k): "" if v is None else str(v) for k, v in env.items()}


def command(service: dict[str, Any]) -> list[str]:
    cmd = service.get("command") or []
    return shlex.split(cmd) if isinstance(cmd, str) else [str(part) for part in cmd]


def mounts(service: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    """Named-volume mounts: volume -> (target, read_only)."""
    found = {}
    for spec in service.get("volumes") or []:
        source, target, *mode = spec.split(":")
        if not source.startswith((".", "/", "~")):
            found[source] = (target, "ro" in mode)
    return found


def bind_mounts(service: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    """Host-path mounts: target -> (source relative to the compose file, read_only)."""
    found = {}
    for spec in service.get("volumes") or []:
        source, target, *mode = spec.split(":")
        if source.startswith((".", "/", "~")):
            found[target] = (source.removeprefix("./"), "ro" in mode)
    return found


def option(args: list[str], name: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def depends_on(service: dict[str, Any]) -> dict[str, str | None]:
    deps = service.get("depends_on")
    return {dep: (spec or {}).get("condition") for dep, spec in deps.items()} if isinstance(deps, dict) else {}


def compose_problems(compose: dict[str, Any]) -> list[str]:
    problems = []
    services = compose.get("services") or {}
    if set(services) != {"redis", "trainer", "api", "lb"}:
        return [f"services are {sorted(services)}, expected api, lb, redis, trainer"]
    redis, trainer, api = services["redis"], services["trainer"], services["api"]
    declared = set(compose.get("volumes") or {})
    for name, service in services.items():
        for volume in mounts(service):
            if volume not in declared:
                problems.append(f"{name} mounts volume {volume!r}, not declared under volumes:")
    if not str(redis.get("image", "")).startswith("redis:"):
        problems.append("redis does not use the official image")
    if "ports" in redis:
        problems.append("redis publishes ports to the host")
    if "redis-cli ping" not in " ".join(command_of(redis.get("healthcheck"))):
        problems.append("redis has no `redis-cli ping` healthcheck")
    if "--appendonly yes" not in " ".join(command(redis)) or "/data" not in [t for t, _ in mounts(redis).values()]:
        problems.append("redis does not keep an append-only file on a named volume at /data")
    if "/readyz" not in " ".join(command_of(api.get("healthcheck"))):
        problems.append("api has no healthcheck on /readyz")
    conditions = depends_on(api)
    if conditions != {"redis": "service_healthy", "trainer": "service_completed_successfully"}:
        problems.append(f"api depends_on conditions are {conditions}")
    if "ports" in api:
        problems.append("api publishes ports (replicas cannot share a host port; lb publishes 8000)")
    if "container_name" in api:
        problems.append("api has a container_name (--scale api=N needs names compose makes up)")
    if str(trainer.get("restart")) != "no":
        problems.append("trainer is not one-shot (restart: 'no')")
    if "ports" in trainer:
        problems.append("trainer publishes ports")
    if (trainer.get("healthcheck") or {}).get("disable") is not True:
        problems.append("trainer keeps the image's healthcheck (it probes the api port)")
    out = option(command(trainer), "--out")
    written = mounts(trainer).get("artifacts")
    if written is None or written[1] or written[0] != out:
        problems.append(f"trainer's --out {out} is not the writable artifacts volume ({written})")
    read = mounts(api).get("artifacts")
    if read is None or not read[1] or read[0] != environment(api).get("SEQREC_ARTIFACTS"):
        problems.append(f"api's SEQREC_ARTIFACTS is not the read-only artifacts volume ({read})")
    return problems + lb_problems(services["lb"])


def lb_problems(lb: dict[str, Any]) -> list[str]:
    problems = []
    if image_version(str(lb.get("image", ""))) is None:
        problems.append(f"lb's image {lb.get('image')} is not the official nginx at a pinned version (nginx:X.Y...)")
    if [str(p) for p in lb.get("ports") or []] != ["8000:8000"]:
        problems.append(f"lb publishes {lb.get('ports')}, not 8000:8000")
    if bind_mounts(lb).get(LB_CONF_TARGET) != ("docker/nginx.conf", True):
        problems.append(f"lb does not mount docker/nginx.conf read-only at {LB_CONF_TARGET}")
    if not re.search(r"\b127\.0\.0\.1:8000/", " ".join(command_of(lb.get("healthcheck")))):
        problems.append("lb has no healthcheck through its own port 8000")
    if depends_on(lb) != {"api": "service_healthy"}:
        problems.append(f"lb depends_on conditions are {depends_on(lb)}, not api: service_healthy")
    return problems


def image_version(image: str) -> tuple[int, ...] | None:
    """nginx:1.30.4-alpine -> (1, 30, 4); a minor tag (nginx:1.30-alpine) floats to its newest patch,
    counted here as 999; None for anything but the official image at a pinned version."""
    found = re.fullmatch(r"nginx:(\d+)\.(\d+)(?:\.(\d+))?(?:-[\w.]+)?", image)
    if found is None:
        return None
    major, minor, patch = found.groups()
    return int(major), int(minor), int(patch) if patch is not None else 999


def body_limit(compose: dict[str, Any]) -> int:
    """The api's request body limit: SEQREC_MAX_BODY_BYTES where compose sets it, else the settings default."""
    env = environment(compose["services"]["api"])
    if "SEQREC_MAX_BODY_BYTES" in env:
        return Settings(_env_file=None, max_body_bytes=int(env["SEQREC_MAX_BODY_BYTES"])).max_body_bytes
    return int(Settings.model_fields["max_body_bytes"].default)


# --- nginx.conf ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Directive:
    block: tuple[str, ...]  # the enclosing blocks, outermost first: ("http", "upstream api")
    name: str
    args: tuple[str, ...]  # quotes removed: `Connection ""` -> ("Connection", "")


def parse_nginx(text: str) -> list[Directive]:
    """Every directive of an nginx config, blocks included (`upstream api {` is ("upstream", ("api",)))."""
    tokens = re.findall(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|#[^\n]*|[{};]|[^\s{};]+', text)
    found: list[Directive] = []
    block: list[str] = []
    words: list[str] = []
    for token in tokens:
        if token.startswith("#"):
            continue
        if token in ("{", ";"):
            name, *args = words
            found.append(Directive(tuple(block), name, tuple(a[1:-1] if a[:1] in "\"'" and a else a for a in args)))
            if token == "{":
                block.append(" ".join(words))
            words = []
        elif token == "}":
            block.pop()
        else:
            words.append(token)
    return found


def nginx_size(value: str) -> int:
    """An nginx size (`1m`, `512k`, `1048576`) in bytes."""
    found = re.fullmatch(r"(\d+)([kKmMgG]?)", value)
    if found is None:
        raise ValueError(f"not an nginx size: {value!r}")
    return int(found.group(1)) * {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[found.group(2).lower()]


def nginx_problems(text: str, limit: int, image: str) -> list[str]:
    """The load balancer's config against the api: upstream, DNS, body limit, keepalive, retries, headers."""
    directives = parse_nginx(text)
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
    servers = [s for group in upstreams.values() for s in group]
    resolved = [s for s in servers if "resolve" in s.args]
    if not resolved and not any("$" in p for p in passes):
        problems.append("api is resolved once at start-up (no `resolve`, no variable in proxy_pass): "
                        "replicas started later get no traffic")
    for group in {s.block for s in resolved}:
        if not any(d.name == "zone" and d.block == group for d in directives):
            problems.append(f"{group[-1]} resolves without a zone (`resolve` needs the shared memory)")
    version = image_version(image)
    if resolved and (version is None or version < RESOLVE_SINCE):
        problems.append(f"{image}: `server ... resolve` needs nginx 1.27.3 or later")
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


def mounted_nginx_conf(compose: dict[str, Any], root: Path = REPO) -> Path:
    source, _ = bind_mounts(compose["services"]["lb"])[LB_CONF_TARGET]
    return root / source


def command_of(healthcheck: dict[str, Any] | None) -> list[str]:
    test = (healthcheck or {}).get("test") or []
    parts = shlex.split(test) if isinstance(test, str) else [str(t) for t in test]
    return parts[1:] if parts and parts[0] in ("CMD", "CMD-SHELL") else parts


def environment_problems(compose: dict[str, Any]) -> list[str]:
    problems = []
    for name, allowed in (("api", SETTINGS_VARIABLES), ("trainer", SETTINGS_VARIABLES | set(TRAINER_VARIABLES))):
        env = environment(compose["services"][name])
        for variable in sorted(v for v in env if v.startswith("SEQREC_")):
            if variable not in allowed:
                what = "a service setting" if name == "api" else "a service setting or a trainer variable"
                problems.append(f"{name} sets {variable}, not {what}")
    values: dict[str, Any] = {v.removeprefix("SEQREC_").lower(): x
                              for v, x in environment(compose["services"]["api"]).items() if v in SETTINGS_VARIABLES}
    try:
        Settings(_env_file=None, **values)
    except ValueError as err:
        problems.append(f"api's settings do not validate: {err}")
    return problems


def seqrec_subcommands(compose: dict[str, Any]) -> set[str]:
    subs: set[str] = set()
    for service in compose["services"].values():
        args = command(service)
        subs.update(args[i + 1] for i, arg in enumerate(args[:-1]) if arg == "seqrec")
    return subs


def subcommand_exists(name: str) -> bool:
    try:
        seqrec_main([name, "--help"])
    except SystemExit as exit_:
        return exit_.code == 0
    return False


# --- Dockerfiles ---------------------------------------------------------------------------------

@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def args(self, keyword: str) -> list[str]:
        return [rest for kw, rest in self.instructions if kw == keyword]


def parse_dockerfile(text: str) -> list[Stage]:
    """Stages with their instructions (continuations joined, comments dropped, ARG defaults in FROM)."""
    logical, pending = [], ""
    for line in text.splitlines():
        if line.strip().startswith("#") or not line.strip():
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
        else:
            logical.append(pending + line)
            pending = ""
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        keyword, _, rest = line.strip().partition(" ")
        keyword, rest = keyword.upper(), rest.strip()
        if keyword == "ARG" and not stages:
            name, _, default = rest.partition("=")
            global_args[name] = default.strip('"')
        elif keyword == "FROM":
            words = [w for w in rest.split() if not w.startswith("--")]
            base = re.sub(r"\$\{?(\w+)\}?", lambda m: global_args.get(m.group(1), ""), words[0])
            stages.append(Stage(base, words[2] if len(words) > 2 and words[1].upper() == "AS" else None))
        elif stages:
            stages[-1].instructions.append((keyword, rest))
    return stages


def words_of(rest: str) -> list[str]:
    return [str(w) for w in json.loads(rest)] if rest.startswith("[") else shlex.split(rest)


def dockerignored(path: str, patterns: list[str]) -> bool:
    """Docker's .dockerignore matching (last matching pattern wins; a folder covers its contents)."""
    ignored = False
    parts = path.strip("/").split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in patterns:
        negate = pattern.startswith("!")
        glob = pattern.lstrip("!").strip("/")
        regex = "".join(".*" if tok == "**" else "[^/]*" if tok == "*" else "[^/]" if tok == "?"
                        else tok if tok.startswith("[") else re.escape(tok)
                        for tok in re.split(r"(\*\*|\*|\?|\[[^]]*\])", glob))
        regex = regex.replace(".*/", "(.*/)?")
        if any(re.fullmatch(regex, prefix) for prefix in prefixes):
            ignored = not negate
    return ignored


def ignore_patterns() -> list[str]:
    lines = (REPO / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def copy_problems(stages: list[Stage], repo: Path, patterns: list[str]) -> list[str]:
    problems = []
    for stage in stages:
        for keyword, rest in stage.instructions:
            if keyword not in ("COPY", "ADD"):
                continue
            words = words_of(rest)
            if any(w.startswith("--from") for w in words):
                continue
            for source in [w for w in words if not w.startswith("--")][:-1]:
                if not (repo / source).exists():
                    problems.append(f"{keyword} {source}: no such path in the repository")
                elif dockerignored(source, patterns):
                    problems.append(f"{keyword} {source}: excluded by .dockerignore")
    return problems


def final_stage_problems(stages: list[Stage]) -> list[str]:
    problems = []
    final = stages[-1]
    users = final.args("USER")
    if not users or users[-1].split(":")[0] in ROOT_USERS:
        problems.append(f"the final stage runs as {users[-1] if users else 'root (no USER)'}")
    for run in final.args("RUN"):
        if COMPILERS.search(run):
            problems.append(f"the final stage installs build tools: {run[:80]}")
        if re.search(r"\bpip3? install\b", run):
            problems.append("the final stage runs pip install (the venv comes from the builder)")
    if not any("--from=" in rest for rest in final.args("COPY")):
        problems.append("the final stage copies nothing from a builder stage")
    checks = final.args("HEALTHCHECK")
    if not checks or "/readyz" not in checks[-1]:
        problems.append("no HEALTHCHECK on /readyz")
    cmd = final.args("CMD")
    if not cmd or words_of(cmd[-1]) != ["seqrec", "serve", "--host", "0.0.0.0", "--port", "8000"]:
        problems.append(f"CMD is {cmd[-1] if cmd else None}, not seqrec serve --host 0.0.0.0 --port 8000")
    if "8000" not in " ".join(final.args("EXPOSE")).split():
        problems.append("port 8000 is not exposed")
    env = " ".join(final.args("ENV"))
    if "SEQREC_ARTIFACTS=/artifacts" not in env:
        problems.append("SEQREC_ARTIFACTS is not /artifacts")
    owned = " ".join(run for run in final.args("RUN") if "chown" in run)
    for folder in ("/artifacts", "/cache"):  # fresh named volumes copy the owner of the image's folder
        if folder not in owned:
            problems.append(f"{folder} is not created and handed to the image's user")
    for stage in stages[:-1]:
        no_cache = "PIP_NO_CACHE_DIR=1" in " ".join(stage.args("ENV"))
        if any(re.search(r"\bpip install\b", run) and "--no-cache-dir" not in run for run in stage.args("RUN")) \
                and not no_cache:
            problems.append(f"stage {stage.name}: pip install keeps its cache")
    return problems


def dockerfile(kind: str) -> list[Stage]:
    return parse_dockerfile(DOCKERFILES[kind].read_text())


# --- the real files ------------------------------------------------------------------------------

def test_compose_services_healthchecks_volumes_and_dependencies():
    assert compose_problems(load_compose(COMPOSE)) == []


def test_gpu_override_reserves_a_gpu_for_trainer_and_api():
    compose = load_compose(COMPOSE, COMPOSE_GPU)
    assert compose_problems(compose) == []
    for name in ("trainer", "api"):
        service = compose["services"][name]
        assert service["build"]["dockerfile"] == "docker/Dockerfile.gpu"
        devices = service["deploy"]["resources"]["reservations"]["devices"]
        assert devices == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]
    assert "deploy" not in compose["services"]["redis"]
    assert "deploy" not in compose["services"]["lb"]
    assert compose["services"]["api"]["image"] != load_compose(COMPOSE)["services"]["api"]["image"]


def test_lb_config_proxies_to_every_api_replica():
    compose = load_compose(COMPOSE)
    conf = mounted_nginx_conf(compose)
    assert conf == NGINX_CONF
    assert conf.is_file()
    assert nginx_problems(conf.read_text(), body_limit(compose), compose["services"]["lb"]["image"]) == []


def test_lb_body_limit_is_the_services_own():
    compose = load_compose(COMPOSE)
    assert body_limit(compose) == Settings(_env_file=None).max_body_bytes  # compose leaves the default
    sizes = [d.args[0] for d in parse_nginx(NGINX_CONF.read_text()) if d.name == "client_max_body_size"]
    assert [nginx_size(size) for size in sizes] == [body_limit(compose)]
    compose["services"]["api"]["environment"]["SEQREC_MAX_BODY_BYTES"] = str(2 << 20)
    assert body_limit(compose) == 2 << 20
    assert any("client_max_body_size" in p for p in nginx_problems(NGINX_CONF.read_text(), body_limit(compose),
                                                                   compose["services"]["lb"]["image"]))


def test_nginx_parser_and_sizes():
    text = """
    # a comment; with { braces }
    http {
        resolver 127.0.0.11 valid=10s;  # trailing comment
        upstream api { server api:8000 resolve; }
        log_format x '$a "b" ;{}';
        server { location = /recommend { proxy_set_header Connection ""; } }
    }
    """
    assert parse_nginx(text) == [
        Directive((), "http", ()),
        Directive(("http",), "resolver", ("127.0.0.11", "valid=10s")),
        Directive(("http",), "upstream", ("api",)),
        Directive(("http", "upstream api"), "server", ("api:8000", "resolve")),
        Directive(("http",), "log_format", ("x", '$a "b" ;{}')),
        Directive(("http",), "server", ()),
        Directive(("http", "server"), "location", ("=", "/recommend")),
        Directive(("http", "server", "location = /recommend"), "proxy_set_header", ("Connection", "")),
    ]
    assert [nginx_size(s) for s in ("1m", "1M", "512k", "1048576", "1g")] == [1 << 20, 1 << 20, 512 << 10, 1 << 20,
                                                                             1 << 30]
    assert image_version("nginx:1.30-alpine") == (1, 30, 999)
    assert image_version("nginx:1.27.2-alpine") == (1, 27, 2)
    assert image_version("nginx:latest") is None
    assert image_version("nginx") is None


def test_compose_environment_is_service_settings_or_trainer_variables():
    for compose in (load_compose(COMPOSE), load_compose(COMPOSE, COMPOSE_GPU)):
        assert environment_problems(compose) == []


@pytest.mark.parametrize("variable", sorted(TRAINER_VARIABLES))
def test_trainer_variables_are_read_by_the_code_and_documented(variable):
    glob = TRAINER_VARIABLES[variable]
    texts = [path.read_text() for path in REPO.glob(glob)]
    quoted = re.compile(rf"[\"']{variable}[\"']|\$\{{?{variable}\b")
    assert any(quoted.search(text) for text in texts), f"nothing in {glob} reads {variable}"
    assert variable in DOCS.read_text()


def test_compose_interpolated_variables_are_documented():
    docs = DOCS.read_text()
    for path in (COMPOSE, COMPOSE_GPU):
        for variable in re.findall(r"\$\{(\w+)", path.read_text()):
            assert variable in docs, f"{path.name} reads ${variable}; document it in docs/DOCKER.md"


@pytest.mark.parametrize("subcommand", sorted(seqrec_subcommands(load_compose(COMPOSE, COMPOSE_GPU)) | {"serve"}))
def test_seqrec_subcommands_run_by_compose_exist(subcommand, capsys):
    assert subcommand_exists(subcommand), f"`seqrec {subcommand} --help` does not exit 0"
    assert f"usage: seqrec {subcommand}" in capsys.readouterr().out


def test_default_pipeline_config_is_in_the_image():
    trainer = load_compose(COMPOSE)["services"]["trainer"]
    config = option(command(trainer), "--config")
    assert config is not None
    assert (REPO / config).is_file(), f"the trainer's default --config {config} is not in the repository"
    assert config.startswith("configs/"), "the images carry configs/ only"
    assert not dockerignored(config, ignore_patterns())


@pytest.mark.parametrize("kind", sorted(DOCKERFILES))
def test_dockerfile_copy_sources_exist(kind):
    assert copy_problems(dockerfile(kind), REPO, ignore_patterns()) == []


@pytest.mark.parametrize("kind", sorted(DOCKERFILES))
def test_final_stage_is_lean_non_root_and_serves(kind):
    assert final_stage_problems(dockerfile(kind)) == []


def test_cpu_image_is_slim_with_cpu_torch_first():
    stages = dockerfile("cpu")
    assert [s.base for s in stages] == ["python:3.11-slim", "python:3.11-slim"]
    builder = " ".join(stages[0].args("RUN"))
    text = DOCKERFILES["cpu"].read_text()
    assert "download.pytorch.org/whl/cpu" in text
    assert builder.index("TORCH_SPEC") < builder.index("/src"), "torch (CPU) must go in before the project"


def test_gpu_image_has_cuda_runtime_cuda_torch_and_faiss_gpu():
    stages = dockerfile("gpu")
    assert all(re.fullmatch(r"nvidia/cuda:12\.[\d.]+-(cudnn-)?runtime-ubuntu[\d.]+", s.base) for s in stages)
    text = DOCKERFILES["gpu"].read_text()
    assert re.search(r"download\.pytorch\.org/whl/cu12\d", text)
    assert "faiss-gpu-cu12" in text
    assert "startswith('faiss-cpu')" in text, "faiss-cpu must be left out of the GPU image's requirements"


def test_dockerignore_keeps_local_state_out_of_the_context():
    patterns = ignore_patterns()
    for path in (".venv/bin/python", "data/ml-1m/sequences.parquet", "artifacts/current", ".git/HEAD", ".env",
                 "offline/__pycache__/cli.cpython-311.pyc", "service/app.pyc", ".pytest_cache/v/cache",
                 ".mypy_cache/3.11/x.json", ".ruff_cache/content", "seqrec.egg-info/PKG-INFO", "runs/beauty/last.pt"):
        assert dockerignored(path, patterns), path
    for path in ("pyproject.toml", "README.md", "offline/cli/__init__.py", "configs/ml-1m/transformer.yaml"):
        assert not dockerignored(path, patterns), path


# --- the checks fail on broken files -------------------------------------------------------------

def _set(path: list[str], value: Any) -> Callable[[dict[str, Any]], None]:
    def apply(compose: dict[str, Any]) -> None:
        node = compose
        for key in path[:-1]:
            node = node[key]
        if value is None:
            del node[path[-1]]
        else:
            node[path[-1]] = value
    return apply


BREAKAGES = [
    (_set(["services", "redis", "ports"], ["6379:6379"]), "redis publishes ports"),
    (_set(["services", "redis", "healthcheck"], None), "redis-cli ping"),
    (_set(["services", "redis", "command"], ["redis-server"]), "append-only"),
    (_set(["services", "api", "healthcheck"], None), "/readyz"),
    (_set(["services", "api", "depends_on", "trainer", "condition"], "service_started"), "depends_on"),
    (_set(["services", "trainer", "restart"], "always"), "one-shot"),
    (_set(["services", "trainer", "healthcheck"], None), "image's healthcheck"),
    (_set(["services", "api", "volumes"], ["artifacts:/artifacts"]), "read-only"),
    (_set(["services", "trainer", "command"], ["seqrec", "pipeline", "--out", "/tmp/x"]), "--out"),
    (_set(["volumes", "cache"], None), "not declared"),
    (_set(["services", "trainer"], None), "expected api, lb, redis, trainer"),
    (_set(["services", "api", "ports"], ["8000:8000"]), "api publishes ports"),
    (_set(["services", "api", "container_name"], "seqrec-api"), "container_name"),
    (_set(["services", "lb", "ports"], None), "not 8000:8000"),
    (_set(["services", "lb", "image"], "nginx:latest"), "pinned version"),
    (_set(["services", "lb", "volumes"], ["./docker/nginx.conf:/etc/nginx/nginx.conf"]), "read-only"),
    (_set(["services", "lb", "healthcheck"], None), "lb has no healthcheck"),
    (_set(["services", "lb", "depends_on"], {"api": {"condition": "service_started"}}), "api: service_healthy"),
]


@pytest.mark.parametrize(("breakage", "expected"), BREAKAGES, ids=[expected for _, expected in BREAKAGES])
def test_compose_check_catches(breakage, expected):
    compose = copy.deepcopy(load_compose(COMPOSE))
    breakage(compose)
    assert any(expected in problem for problem in compose_problems(compose))


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
]


@pytest.mark.parametrize(("old", "new", "expected"), NGINX_BREAKAGES, ids=[e for _, _, e in NGINX_BREAKAGES])
def test_nginx_check_catches(old, new, expected):
    compose = load_compose(COMPOSE)
    text = NGINX_CONF.read_text()
    assert old in text, f"the breakage no longer applies: {old!r} is not in docker/nginx.conf"
    problems = nginx_problems(text.replace(old, new, 1), body_limit(compose), compose["services"]["lb"]["image"])
    assert any(expected in problem for problem in problems), problems


def test_nginx_check_catches_resolve_on_an_nginx_without_it():
    problems = nginx_problems(NGINX_CONF.read_text(), body_limit(load_compose(COMPOSE)), "nginx:1.26-alpine")
    assert any("needs nginx 1.27.3" in problem for problem in problems)


def test_environment_check_catches_unknown_and_invalid_variables():
    compose = copy.deepcopy(load_compose(COMPOSE))
    compose["services"]["api"]["environment"]["SEQREC_CACHE"] = "/cache"  # a trainer variable on the api
    compose["services"]["trainer"]["environment"]["SEQREC_NO_SUCH"] = "1"
    compose["services"]["api"]["environment"]["SEQREC_WORKERS"] = "0"
    problems = " | ".join(environment_problems(compose))
    assert "api sets SEQREC_CACHE" in problems
    assert "trainer sets SEQREC_NO_SUCH" in problems
    assert "do not validate" in problems


def test_subcommand_check_catches_a_missing_command():
    assert not subcommand_exists("no-such-command")


BAD_DOCKERFILE = """\
ARG BASE=python:3.11
FROM ${BASE} AS builder
RUN pip install torch
FROM ${BASE}
RUN apt-get update && apt-get install -y \\
# a comment inside a continuation is dropped
    gcc
COPY no/such/file /app/
COPY .venv /app/.venv
CMD ["python", "-m", "http.server"]
USER root
"""


def test_dockerfile_checks_catch_a_bad_file():
    stages = parse_dockerfile(BAD_DOCKERFILE)
    assert [s.base for s in stages] == ["python:3.11", "python:3.11"]
    copies = " | ".join(copy_problems(stages, REPO, ignore_patterns()))
    assert "no/such/file: no such path" in copies
    assert ".venv: excluded by .dockerignore" in copies
    final = " | ".join(final_stage_problems(stages))
    for expected in ("runs as root", "build tools", "copies nothing from a builder", "HEALTHCHECK", "CMD is",
                     "8000", "SEQREC_ARTIFACTS", "/artifacts is not created", "pip install keeps its cache"):
        assert expected in final, expected


# --- nginx for real (where installed) ------------------------------------------------------------

NO_NGINX = "nginx is not installed (Debian: apt-get install nginx); the static checks of docker/nginx.conf still run"


def load_bench() -> ModuleType:
    """offline/bench/replicas.py, which runs docker/nginx.conf on the host (not a package, so loaded by path)."""
    spec = importlib.util.spec_from_file_location("bench_replicas", REPO / "offline" / "bench" / "replicas.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_runs_docker_nginx_conf_with_only_the_servers_replaced(tmp_path):
    bench = load_bench()
    local = bench.local_nginx_config(NGINX_CONF.read_text(), ["127.0.0.1:1", "127.0.0.1:2"], "127.0.0.1:3", tmp_path)
    original, derived = parse_nginx(NGINX_CONF.read_text()), parse_nginx(local)

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
        bench.local_nginx_config("http {\n}\n", ["127.0.0.1:1"], "127.0.0.1:3", tmp_path)


@pytest.mark.skipif(shutil.which("nginx") is None, reason=NO_NGINX)
def test_nginx_accepts_the_config(tmp_path):
    bench = load_bench()
    # `api` and 127.0.0.11 exist only on the compose network; an nginx older than 1.27.3 (Debian 12 has
    # 1.22) rejects `resolve`, so it checks everything else.
    resolve = bench.nginx_version() >= RESOLVE_SINCE
    conf = tmp_path / "nginx.conf"
    server = "localhost:8000" if resolve else "127.0.0.1:8000"
    conf.write_text(bench.local_nginx_config(NGINX_CONF.read_text(), [server], "127.0.0.1:8000", tmp_path,
                                             resolve=resolve))
    checked = subprocess.run([*bench.nginx_command(conf, tmp_path), "-t"], capture_output=True, text=True,
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


@pytest.mark.skipif(shutil.which("nginx") is None, reason=NO_NGINX)
def test_nginx_skips_a_dead_replica_passes_ids_and_enforces_the_body_limit(echo_server):
    bench = load_bench()
    address, seen = echo_server
    # nothing listens there, so every connection is refused; max_fails=0 keeps nginx sending it its
    # round-robin share instead of setting it aside after the first failure
    dead = f"127.0.0.1:{bench.free_port()} max_fails=0"
    limit = body_limit(load_compose(COMPOSE))
    with bench.start_nginx([dead, address]) as url:
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


# --- the entrypoint ------------------------------------------------------------------------------

def run_entrypoint(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", str(ENTRYPOINT), *args], capture_output=True, text=True, timeout=30,
                          env={"PATH": "/usr/bin:/bin", **(env or {})}, check=False)


@pytest.mark.skipif(shutil.which("sh") is None, reason="needs a POSIX sh")
@pytest.mark.parametrize("out_form", ["separate", "equals"])
def test_entrypoint_once_runs_only_without_current(tmp_path, out_form):
    out, marker = tmp_path / "artifacts", tmp_path / "ran"
    out.mkdir()
    out_args = ["--out", str(out)] if out_form == "separate" else [f"--out={out}"]
    job = ["once", "sh", "-c", 'echo ran > "$1"', "job", str(marker), *out_args]

    assert run_entrypoint(*job).returncode == 0
    assert marker.read_text() == "ran\n"  # no current yet: the command runs

    marker.unlink()
    (out / "current").symlink_to(tmp_path)
    skipped = run_entrypoint(*job)
    assert skipped.returncode == 0
    assert not marker.exists()
    assert "not retraining" in skipped.stderr

    assert run_entrypoint(*job, env={"SEQREC_RETRAIN": "1"}).returncode == 0
    assert marker.exists()


@pytest.mark.skipif(shutil.which("sh") is None, reason="needs a POSIX sh")
def test_entrypoint_runs_other_commands_as_given_and_refuses_once_without_out():
    plain = run_entrypoint("sh", "-c", "echo $0 $1", "a", "b")
    assert (plain.returncode, plain.stdout) == (0, "a b\n")
    refused = run_entrypoint("once", "true")
    assert refused.returncode == 2
    assert "--out" in refused.stderr
