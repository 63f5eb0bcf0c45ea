"""Static checks of the Docker files; there is no Docker engine on the development machine or in CI.

Each check is a function returning the problems it finds, run on the real files (expecting none)
and on broken copies (expecting the breakage named), so a check that can no longer fail shows up.
The entrypoint's `once` guard is run for real with /bin/sh.
"""

from __future__ import annotations

import copy
import json
import re
import shlex
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
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


def option(args: list[str], name: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def compose_problems(compose: dict[str, Any]) -> list[str]:
    problems = []
    services = compose.get("services") or {}
    if set(services) != {"redis", "trainer", "api"}:
        return [f"services are {sorted(services)}, expected api, redis, trainer"]
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
    conditions = {dep: (spec or {}).get("condition") for dep, spec in (api.get("depends_on") or {}).items()} \
        if isinstance(api.get("depends_on"), dict) else {}
    if conditions != {"redis": "service_healthy", "trainer": "service_completed_successfully"}:
        problems.append(f"api depends_on conditions are {conditions}")
    if "8000:8000" not in [str(p) for p in api.get("ports") or []]:
        problems.append("api does not publish 8000:8000")
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
    return problems


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
    values = {v.removeprefix("SEQREC_").lower(): x for v, x in environment(compose["services"]["api"]).items()
              if v in SETTINGS_VARIABLES}
    try:
        Settings(_env_file=None, **values)
    except ValueError as err:
        problems.append(f"api's settings do not validate: {err}")
    return problems


def seqrec_subcommands(compose: dict[str, Any]) -> set[str]:
    subs = set()
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
    assert compose["services"]["api"]["image"] != load_compose(COMPOSE)["services"]["api"]["image"]


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
    for path in ("pyproject.toml", "README.md", "offline/cli.py", "configs/ml-1m/transformer.yaml"):
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
    (_set(["services", "trainer"], None), "expected api, redis, trainer"),
]


@pytest.mark.parametrize(("breakage", "expected"), BREAKAGES, ids=[expected for _, expected in BREAKAGES])
def test_compose_check_catches(breakage, expected):
    compose = copy.deepcopy(load_compose(COMPOSE))
    breakage(compose)
    assert any(expected in problem for problem in compose_problems(compose))


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
