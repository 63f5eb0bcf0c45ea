"""docker/smoke.sh and its override docker/compose.local.yml.

The smoke itself needs a Docker engine and takes minutes: it is the one test marked `docker`
(deselected by default; `pytest -m docker` runs it). The rest reads the override as
`docker-compose config` merges it onto docker-compose.yml, and checks that the ports the host
network makes every service share agree with each other.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from typing import Any
from urllib.parse import urlparse

import pytest

from tests.docker.support import COMPOSE, REPO, command, compose_config, environment, healthcheck_command, option

SMOKE = REPO / "docker" / "smoke.sh"
LOCAL = REPO / "docker" / "compose.local.yml"
NGINX_CONF = REPO / "docker" / "nginx.conf"


def local_stack() -> dict[str, Any]:
    return dict(compose_config(COMPOSE, LOCAL)["services"])


def url_port(text: str) -> int:
    port = urlparse(text).port
    assert port is not None, text
    return port


def test_override_runs_every_service_on_the_host_network_without_published_ports():
    services = local_stack()
    assert sorted(services) == ["api", "lb", "redis", "trainer"]
    for name, service in services.items():
        assert service.get("network_mode") == "host", name
        assert not service.get("ports"), name


def test_override_ports_agree():
    services = local_stack()
    api, lb, redis = services["api"], services["lb"], services["redis"]
    api_port = int(option(command(api), "--port") or 0)
    assert option(command(api), "--host") == "127.0.0.1"
    assert url_port(healthcheck_command(api)[-1]) == api_port
    redis_port = int(option(command(redis), "--port") or 0)
    assert healthcheck_command(redis)[-3:] == ["-p", str(redis_port), "ping"]
    assert url_port(environment(api)["SEQREC_REDIS_URL"]) == redis_port
    assert len({api_port, redis_port, url_port(healthcheck_command(lb)[-1])}) == 3
    assert 8000 not in {api_port, redis_port}, "the host network: keep clear of a seqrec serve on the default port"


def test_override_keeps_the_official_images_unless_told():
    services = local_stack()
    assert services["redis"]["image"] == "redis:7-alpine"
    assert services["lb"]["image"].startswith("nginx:")
    assert services["api"]["image"] == services["trainer"]["image"] == "seqrec:cpu"


def test_smoke_rewrites_lines_that_nginx_conf_has():
    text = NGINX_CONF.read_text()
    script = SMOKE.read_text()
    for line in ("server api:8000 resolve;", "listen 8000;"):
        assert len(re.findall(rf"^\s*{re.escape(line)}$", text, flags=re.MULTILINE)) == 1, line
        assert f"s/{line}/" in script, line


def test_smoke_script_parses_and_refuses_unknown_arguments():
    subprocess.run(["bash", "-n", str(SMOKE)], check=True, timeout=30)
    done = subprocess.run([str(SMOKE), "--bogus"], capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 2
    assert "unknown argument --bogus" in done.stderr
    helped = subprocess.run([str(SMOKE), "--help"], capture_output=True, text=True, timeout=30, check=False)
    assert helped.returncode == 0
    assert "docker compose" in helped.stdout


@pytest.mark.docker
@pytest.mark.timeout(3600)  # a first run builds the images and trains: tens of minutes
def test_smoke_brings_the_stack_up_and_down():
    if shutil.which("docker") is None or subprocess.run(["docker", "info"], capture_output=True,
                                                         timeout=60, check=False).returncode != 0:
        pytest.skip("no Docker engine answers `docker info`")
    done = subprocess.run([str(SMOKE)], capture_output=True, text=True, timeout=3600, check=False,
                          env={**os.environ, "SEQREC_SMOKE_PROJECT": "seqrec-smoke-test"})
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    assert "/readyz reports Redis: ok" in done.stdout
