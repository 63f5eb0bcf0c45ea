"""What a test needs from the machine beyond Python: skipped without it on a developer's machine, failed in CI
(CI=true), whose runner has it or installs it (.ci/run), so a green CI run never hides a skipped check."""

from __future__ import annotations

import os
import shutil
from typing import NoReturn

import pytest

from offline.bench.lib.processes import listening


def missing(reason: str) -> NoReturn:
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI must run this test, but {reason}")
    pytest.skip(reason)


def shared_redis() -> None:
    """The Redis every machine of the project runs at 127.0.0.1:6379."""
    if not listening(6379):
        missing("no Redis listening on 127.0.0.1:6379")


def program(name: str) -> str:
    """The path of ``name`` (redis-server, nginx)."""
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin:/sbin:/bin")
    if path is None:
        missing(f"{name} is not installed (Debian: apt-get install {'redis-server' if 'redis' in name else name})")
    return path
