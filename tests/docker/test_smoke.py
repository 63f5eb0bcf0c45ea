"""docker/smoke.sh and its override docker/compose.local.yml.

The smoke itself needs a Docker engine and takes minutes: it is the one test marked `docker`
(deselected by default; `pytest -m docker` runs it). The rest reads the override as
`docker-compose config` merges it onto docker-compose.yml, and checks that the ports the host
network makes every service share agree with each other, that its second replica `api-2` is
docker-compose.yml's api on another port, and that the lb config the smoke writes reaches both.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from typing import Any
from urllib.parse import urlparse

import pytest

from tests.docker.support import (
    COMPOSE,
    REPO,
    command,
    compose_config,
    depends_on,
    environment,
    healthcheck_command,
    option,
    parse_nginx,
)

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
    assert sorted(services) == ["api", "api-2", "keygen", "lb", "redis", "trainer"]
    for name, service in services.items():
        assert service.get("network_mode") == "host", name
        assert not service.get("ports"), name


def test_override_ports_agree():
    services = local_stack()
    lb, redis = services["lb"], services["redis"]
    redis_port = int(option(command(redis), "--port") or 0)
    assert healthcheck_command(redis)[-3:] == ["-p", str(redis_port), "ping"]
    api_ports = []
    for name in ("api", "api-2"):
        api = services[name]
        api_ports.append(int(option(command(api), "--port") or 0))
        assert option(command(api), "--host") == "127.0.0.1", name
        assert url_port(healthcheck_command(api)[-1]) == api_ports[-1], name
        assert url_port(environment(api)["SEQREC_REDIS_URL"]) == redis_port, name
    assert len({*api_ports, redis_port, url_port(healthcheck_command(lb)[-1])}) == 4
    assert 8000 not in {*api_ports, redis_port}, "the host network: keep clear of a seqrec serve on the default port"


def test_override_second_replica_is_the_api_on_another_port():
    """`api-2` stands for `--scale api=2`: the same service (environment, the reload poll included, volumes,
    dependencies, image) but for the port it listens on; and the lb waits for both."""
    services = local_stack()

    def without_port(service: dict[str, Any]) -> dict[str, Any]:
        args = command(service)
        port = option(args, "--port")
        return {**service, "command": [a for a in args if a != port],
                "healthcheck": {**service["healthcheck"], "test": service["healthcheck"]["test"][:-1]}}

    assert without_port(services["api-2"]) == without_port(services["api"])
    assert environment(services["api-2"])["SEQREC_RELOAD_POLL_S"] == "2"
    assert depends_on(services["lb"]) == {"api": "service_healthy", "api-2": "service_healthy"}


def test_smoke_points_the_lb_at_both_replicas(tmp_path):
    """The smoke's own `nginx_conf` function, run on docker/nginx.conf: one upstream with both replicas' ports."""
    function = re.search(r"^nginx_conf\(\) \{\n.*?^\}\n", SMOKE.read_text(), flags=re.MULTILINE | re.DOTALL)
    assert function is not None
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "WORK": str(tmp_path), "SEQREC_SMOKE_PORT": "18080",
           "SEQREC_SMOKE_API_PORT": "18081", "SEQREC_SMOKE_API2_PORT": "18082"}
    subprocess.run(["bash", "-c", f"set -euo pipefail; cd {REPO}; {function.group(0)}nginx_conf"], env=env,
                   check=True, timeout=30)
    parsed = tmp_path / "parsed"
    parsed.mkdir()
    directives = parse_nginx((tmp_path / "nginx.conf").read_text(), parsed)
    servers = [d.args for d in directives if d.name == "server" and d.block[-1:] == ("upstream api",)]
    assert servers == [("127.0.0.1:18081",), ("127.0.0.1:18082",)]
    assert [d.args for d in directives if d.name == "listen"] == [("127.0.0.1:18080",)]


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
    assert "a retired item leaves every replica: ok" in done.stdout
