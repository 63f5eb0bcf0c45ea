"""The compose files, as `docker-compose config` resolves them: services, healthchecks, volumes and
dependencies, the GPU override, the environment against the service's settings, and the commands run.

`docker-compose config` itself refuses a file that breaks the compose schema or names an undefined
volume or service; the checks here are the project's own. Each runs on the real files (expecting
none) and on broken copies (expecting the breakage named), so a check that can no longer fail shows up.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from offline.cli import main as seqrec_main
from service.http.settings import Settings
from tests.docker.support import (
    COMPOSE,
    COMPOSE_GPU,
    DOCS,
    LB_CONF_TARGET,
    REPO,
    ComposeError,
    command,
    compose_config,
    compose_config_of,
    depends_on,
    dockerignored,
    environment,
    healthcheck_command,
    ignore_patterns,
    image_version,
    option,
    raw_compose,
    volumes,
)

SETTINGS_VARIABLES = {"SEQREC_" + name.upper() for name in Settings.model_fields}
# Variables the trainer container reads that are not service settings, with the files that read them
# (checked below, so the list cannot outlive the code).
TRAINER_VARIABLES = {
    "SEQREC_CACHE": "offline/**/*.py",
    "SEQREC_MOVIELENS_URL": "offline/**/*.py",
    "SEQREC_PIPELINE_CONFIG": "offline/**/*.py",
    "SEQREC_RETRAIN": "docker/entrypoint.sh",
}


def redis_problems(redis: dict[str, Any]) -> list[str]:
    problems = []
    if not str(redis.get("image", "")).startswith("redis:"):
        problems.append("redis does not use the official image")
    if "ports" in redis:
        problems.append("redis publishes ports to the host")
    if "redis-cli ping" not in " ".join(healthcheck_command(redis)):
        problems.append("redis has no `redis-cli ping` healthcheck")
    if "--appendonly yes" not in " ".join(command(redis)) or volumes(redis, "volume").get("redis-data", ("",))[0] \
            != "/data":
        problems.append("redis does not keep an append-only file on a named volume at /data")
    return problems


def api_and_trainer_problems(api: dict[str, Any], trainer: dict[str, Any]) -> list[str]:
    problems = []
    if "/readyz" not in " ".join(healthcheck_command(api)):
        problems.append("api has no healthcheck on /readyz")
    conditions = depends_on(api)
    if conditions != {"redis": "service_healthy", "trainer": "service_completed_successfully",
                      "keygen": "service_completed_successfully"}:
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
    written = volumes(trainer, "volume").get("artifacts")
    if written is None or written[1] or written[0] != out:
        problems.append(f"trainer's --out {out} is not the writable artifacts volume ({written})")
    # Writable: the catalogue journal of /admin/items is written beside the served bundle (service/system/catalog.py).
    served = volumes(api, "volume").get("artifacts")
    if served is None or served[1] or served[0] != environment(api).get("SEQREC_ARTIFACTS"):
        problems.append(f"api's SEQREC_ARTIFACTS is not the writable artifacts volume ({served})")
    return problems


KEY_FILE = "SEQREC_API_KEY_FILE"


def key_problems(services: dict[str, Any]) -> list[str]:
    """The stack cannot come up open: keygen writes the key to a volume the api reads it from, before the api
    starts; only the lb publishes a port."""
    keygen, api = services["keygen"], services["api"]
    problems = []
    if command(keygen)[:1] != ["keygen"] or len(command(keygen)) != 2:
        problems.append(f"keygen runs {command(keygen)}, not the entrypoint's `keygen FILE`")
    file = command(keygen)[-1]
    folder = str(Path(file).parent)
    written = {name: target for name, (target, read_only) in volumes(keygen, "volume").items() if not read_only}
    read = {name: target for name, (target, read_only) in volumes(api, "volume").items() if read_only}
    if not any(written.get(name) == folder == target for name, target in read.items()):
        problems.append(f"keygen's {file} is not on a volume the api mounts read-only at {folder}")
    if environment(api).get(KEY_FILE) != file:
        problems.append(f"api's {KEY_FILE} is {environment(api).get(KEY_FILE)}, not keygen's {file}")
    if environment(api).get("SEQREC_API_KEY"):
        problems.append("api sets SEQREC_API_KEY itself (keygen writes it to the key file)")
    if depends_on(api).get("keygen") != "service_completed_successfully":
        problems.append("api does not wait for keygen (depends_on: service_completed_successfully)")
    if str(keygen.get("restart")) != "no" or (keygen.get("healthcheck") or {}).get("disable") is not True:
        problems.append("keygen is not one-shot without the image's healthcheck")
    published = sorted(name for name, service in services.items() if service.get("ports"))
    if published != ["lb"]:
        problems.append(f"services publishing ports: {published}, not the lb alone")
    return problems


def lb_problems(lb: dict[str, Any]) -> list[str]:
    problems = []
    if image_version(str(lb.get("image", ""))) is None:
        problems.append(f"lb's image {lb.get('image')} is not the official nginx at a pinned version (nginx:X.Y...)")
    ports = [f"{p.get('published')}:{p.get('target')}" for p in lb.get("ports") or []]
    if ports != ["8000:8000"]:
        problems.append(f"lb publishes {ports}, not 8000:8000")
    if volumes(lb, "bind").get("docker/nginx.conf") != (LB_CONF_TARGET, True):
        problems.append(f"lb does not mount docker/nginx.conf read-only at {LB_CONF_TARGET}")
    if not re.search(r"\b127\.0\.0\.1:8000/", " ".join(healthcheck_command(lb))):
        problems.append("lb has no healthcheck through its own port 8000")
    if depends_on(lb) != {"api": "service_healthy"}:
        problems.append(f"lb depends_on conditions are {depends_on(lb)}, not api: service_healthy")
    return problems


def compose_problems(compose: dict[str, Any]) -> list[str]:
    services = compose.get("services") or {}
    if set(services) != {"redis", "trainer", "keygen", "api", "lb"}:
        return [f"services are {sorted(services)}, expected api, keygen, lb, redis, trainer"]
    return (redis_problems(services["redis"]) + api_and_trainer_problems(services["api"], services["trainer"])
            + key_problems(services) + lb_problems(services["lb"]))


def environment_problems(compose: dict[str, Any], key_file: Path | None = None) -> list[str]:
    """Every SEQREC_* variable is a setting (or a trainer's), and the api's settings validate, on the host its
    command listens on; its key file, which keygen writes in the stack, is ``key_file`` here."""
    problems = []
    for name, allowed in (("api", SETTINGS_VARIABLES), ("trainer", SETTINGS_VARIABLES | set(TRAINER_VARIABLES)),
                          ("keygen", {"SEQREC_API_KEY"})):
        env = environment(compose["services"][name])
        for variable in sorted(v for v in env if v.startswith("SEQREC_")):
            if variable not in allowed:
                what = "a service setting" if name == "api" else "a service setting or a trainer variable"
                problems.append(f"{name} sets {variable}, not {what}")
    api = compose["services"]["api"]
    values: dict[str, Any] = {v.removeprefix("SEQREC_").lower(): x
                              for v, x in environment(api).items() if v in SETTINGS_VARIABLES}
    values["host"] = option(command(api), "--host") or values.get("host", "127.0.0.1")
    if "api_key_file" in values and key_file is not None:
        values["api_key_file"] = key_file
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


# --- the real files ------------------------------------------------------------------------------

def test_compose_services_healthchecks_volumes_and_dependencies():
    assert compose_problems(compose_config(COMPOSE)) == []


def test_gpu_override_reserves_a_gpu_for_trainer_and_api():
    compose = compose_config(COMPOSE, COMPOSE_GPU)
    assert compose_problems(compose) == []
    for name in ("trainer", "api"):
        service = compose["services"][name]
        assert service["build"]["dockerfile"] == "docker/Dockerfile.gpu"
        devices = service["deploy"]["resources"]["reservations"]["devices"]
        assert devices == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]
    assert "deploy" not in compose["services"]["redis"]
    assert "deploy" not in compose["services"]["lb"]
    assert compose["services"]["api"]["image"] != compose_config(COMPOSE)["services"]["api"]["image"]


def test_compose_environment_is_service_settings_or_trainer_variables(tmp_path):
    key_file = tmp_path / "api_key"
    key_file.write_text("0" * 64)  # what keygen writes
    for compose in (compose_config(COMPOSE), compose_config(COMPOSE, COMPOSE_GPU)):
        assert environment_problems(compose, key_file) == []
    # without the key file the api on 0.0.0.0 would not start: the check sees it
    compose = copy.deepcopy(compose_config(COMPOSE))
    del compose["services"]["api"]["environment"][KEY_FILE]
    assert any("refusing to listen on 0.0.0.0 without an API key" in p for p in environment_problems(compose))


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


def test_seqrec_subcommands_run_by_compose_exist(capsys):
    run_by_compose = seqrec_subcommands(compose_config(COMPOSE, COMPOSE_GPU))
    assert "pipeline" in run_by_compose  # the trainer's, behind `once`: the walk over commands finds it
    subcommands = run_by_compose | {"serve"}  # the images' CMD
    for subcommand in sorted(subcommands):
        assert subcommand_exists(subcommand), f"`seqrec {subcommand} --help` does not exit 0"
        assert f"usage: seqrec {subcommand}" in capsys.readouterr().out


def test_default_pipeline_config_is_in_the_image():
    trainer = compose_config(COMPOSE)["services"]["trainer"]
    config = option(command(trainer), "--config")
    assert config is not None
    assert (REPO / config).is_file(), f"the trainer's default --config {config} is not in the repository"
    assert config.startswith("configs/"), "the images carry configs/ only"
    assert not dockerignored(config, ignore_patterns())


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
    (_set(["services", "api", "volumes"], ["artifacts:/artifacts:ro"]), "api's SEQREC_ARTIFACTS is not the writable"),
    (_set(["services", "trainer", "command"], ["seqrec", "pipeline", "--out", "/tmp/x"]), "--out"),
    (_set(["services", "worker"], {"image": "busybox"}), "expected api, keygen, lb, redis, trainer"),
    (_set(["services", "api", "ports"], ["8000:8000"]), "api publishes ports"),
    (_set(["services", "redis", "ports"], ["6379:6379"]), "not the lb alone"),
    (_set(["services", "keygen", "command"], ["seqrec", "serve"]), "not the entrypoint's `keygen FILE`"),
    (_set(["services", "api", "volumes"], ["artifacts:/artifacts", "secrets:/run/secrets/seqrec"]),
     "not on a volume the api mounts read-only"),
    (_set(["services", "api", "environment", "SEQREC_API_KEY_FILE"], "/tmp/key"), "not keygen's"),
    (_set(["services", "api", "environment", "SEQREC_API_KEY"], "k" * 20), "api sets SEQREC_API_KEY"),
    (_set(["services", "api", "depends_on", "keygen"], None), "does not wait for keygen"),
    (_set(["services", "keygen", "restart"], "always"), "keygen is not one-shot"),
    (_set(["services", "api", "container_name"], "seqrec-api"), "container_name"),
    (_set(["services", "lb", "ports"], None), "not 8000:8000"),
    (_set(["services", "lb", "image"], "nginx:latest"), "pinned version"),
    (_set(["services", "lb", "volumes"], ["./docker/nginx.conf:/etc/nginx/nginx.conf"]), "read-only"),
    (_set(["services", "lb", "healthcheck"], None), "lb has no healthcheck"),
    (_set(["services", "lb", "depends_on"], {"api": {"condition": "service_started"}}), "api: service_healthy"),
]


@pytest.mark.parametrize(("breakage", "expected"), BREAKAGES, ids=[expected for _, expected in BREAKAGES])
def test_compose_check_catches(breakage, expected, tmp_path):
    raw = raw_compose()
    breakage(raw)
    problems = compose_problems(compose_config_of(raw, tmp_path))
    assert any(expected in problem for problem in problems), problems


# What the old hand-written loader checked itself and `docker-compose config` now refuses.
TOOL_BREAKAGES = [
    (_set(["volumes", "cache"], None), "undefined volume"),
    (_set(["services", "trainer"], None), "undefined service"),
    (_set(["services", "api", "healthcheck", "interval"], "often"), "interval"),
]


@pytest.mark.parametrize(("breakage", "expected"), TOOL_BREAKAGES, ids=[expected for _, expected in TOOL_BREAKAGES])
def test_compose_config_refuses(breakage, expected, tmp_path):
    raw = raw_compose()
    breakage(raw)
    with pytest.raises(ComposeError, match=expected):
        compose_config_of(raw, tmp_path)


def test_compose_config_takes_the_defaults_of_unset_variables(tmp_path):
    raw = raw_compose()
    raw["services"]["api"]["environment"]["SEQREC_WORKERS"] = "${SEQREC_NO_SUCH_VARIABLE:-3}"
    assert compose_config_of(raw, tmp_path)["services"]["api"]["environment"]["SEQREC_WORKERS"] == "3"


def test_environment_check_catches_unknown_and_invalid_variables():
    compose = copy.deepcopy(compose_config(COMPOSE))
    compose["services"]["api"]["environment"]["SEQREC_CACHE"] = "/cache"  # a trainer variable on the api
    compose["services"]["trainer"]["environment"]["SEQREC_NO_SUCH"] = "1"
    compose["services"]["api"]["environment"]["SEQREC_WORKERS"] = "0"
    problems = " | ".join(environment_problems(compose))
    assert "api sets SEQREC_CACHE" in problems
    assert "trainer sets SEQREC_NO_SUCH" in problems
    assert "do not validate" in problems


def test_subcommand_check_catches_a_missing_command():
    assert not subcommand_exists("no-such-command")


def test_paths_resolve_against_the_repository(tmp_path):
    # the broken copies live in tmp_path, but their ./docker/nginx.conf is still the repository's
    compose = compose_config_of(raw_compose(), tmp_path)
    assert compose == compose_config(COMPOSE)
    assert Path(compose["services"]["lb"]["volumes"][0]["source"]) == REPO / "docker" / "nginx.conf"
