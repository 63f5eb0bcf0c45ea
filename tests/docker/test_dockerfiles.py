"""The Dockerfiles: hadolint for the general rules (a root last USER, `latest` tags, pip's cache, apt
hygiene, shellcheck on RUN), project checks for what only this project knows (what is copied, what the
final stage holds and serves), and the entrypoint's `once` guard run for real with /bin/sh.

Each project check returns the problems it finds; it runs on the real files (expecting none) and on a
broken file (expecting the breakage named), so a check that can no longer fail shows up.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from service.http.settings import Settings
from tests.docker.support import (
    DOCKERFILES,
    ENTRYPOINT,
    REPO,
    Stage,
    dockerignored,
    hadolint,
    ignore_patterns,
    parse_dockerfile,
    words_of,
)

COMPILERS = re.compile(r"(?<![\w-])(build-essential|gcc|g\+\+|clang|cmake|make|python3(\.\d+)?-dev)(?![\w-])")
SERVE = ["seqrec", "serve", "--host", "0.0.0.0", "--port", "8000"]


def copy_problems(stages: list[Stage], repo: Path, patterns: list[str]) -> list[str]:
    """COPY/ADD sources from the context that are missing or that .dockerignore leaves out."""
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
    """The final stage: a non-root user, no build tools or pip, the builder's venv, and the service."""
    final = stages[-1]
    users = final.args("USER")
    # hadolint's DL3002 catches a last `USER root`; a stage with no USER at all runs as root too
    problems = [] if users else ["the final stage runs as root (no USER)"]
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
    if not cmd or words_of(cmd[-1]) != SERVE:
        problems.append(f"CMD is {cmd[-1] if cmd else None}, not seqrec serve --host 0.0.0.0 --port 8000")
    if "8000" not in " ".join(final.args("EXPOSE")).split():
        problems.append("port 8000 is not exposed")
    if "SEQREC_ARTIFACTS=/artifacts" not in " ".join(final.args("ENV")):
        problems.append("SEQREC_ARTIFACTS is not /artifacts")
    owned = " ".join(run for run in final.args("RUN") if "chown" in run)
    for folder in ("/artifacts", "/cache", "/run/secrets/seqrec"):  # fresh named volumes copy the folder's owner
        if folder not in owned:
            problems.append(f"{folder} is not created and handed to the image's user")
    return problems


def dockerfile(kind: str) -> list[Stage]:
    return parse_dockerfile(DOCKERFILES[kind].read_text())


# --- the real files ------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", sorted(DOCKERFILES))
def test_hadolint_finds_nothing(kind, tmp_path):
    assert hadolint(DOCKERFILES[kind].read_text(), tmp_path) == []


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
                 "offline/__pycache__/cli.cpython-311.pyc", "service/http/app.pyc", ".pytest_cache/v/cache",
                 ".mypy_cache/3.11/x.json", ".ruff_cache/content", "seqrec.egg-info/PKG-INFO", "runs/beauty/last.pt"):
        assert dockerignored(path, patterns), path
    for path in ("pyproject.toml", "README.md", "offline/cli/__init__.py", "configs/ml-1m/transformer.yaml"):
        assert not dockerignored(path, patterns), path


# --- the checks fail on a broken file ------------------------------------------------------------

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


def test_project_checks_catch_a_bad_file():
    stages = parse_dockerfile(BAD_DOCKERFILE)
    assert [s.base for s in stages] == ["python:3.11", "python:3.11"]
    assert stages[1].args("RUN") == ["apt-get update && apt-get install -y     gcc"]
    copies = " | ".join(copy_problems(stages, REPO, ignore_patterns()))
    assert "no/such/file: no such path" in copies
    assert ".venv: excluded by .dockerignore" in copies
    final = " | ".join(final_stage_problems(stages))
    for expected in ("build tools", "copies nothing from a builder", "HEALTHCHECK", "CMD is", "8000",
                     "SEQREC_ARTIFACTS", "/artifacts is not created"):
        assert expected in final, expected
    no_user = parse_dockerfile(BAD_DOCKERFILE.replace("USER root\n", ""))
    assert "the final stage runs as root (no USER)" in final_stage_problems(no_user)


def test_hadolint_catches_a_bad_file(tmp_path):
    found = {finding["code"] for finding in hadolint(BAD_DOCKERFILE, tmp_path)}
    # DL3002: the last USER is root; DL3042: pip keeps its cache (PIP_NO_CACHE_DIR unset, no
    # --no-cache-dir); DL3009: apt lists kept; DL3015: recommended packages installed
    assert {"DL3002", "DL3042", "DL3009", "DL3015"} <= found, found
    latest = hadolint("FROM python:latest\nUSER nobody\n", tmp_path)
    assert [finding["code"] for finding in latest] == ["DL3007"]


def test_hadolint_accepts_pip_without_cache_through_the_environment(tmp_path):
    # the real builders set PIP_NO_CACHE_DIR=1 in ENV rather than --no-cache-dir on every install
    text = "FROM python:3.11-slim\nENV PIP_NO_CACHE_DIR=1\nRUN pip install --requirement /r.txt\nUSER nobody\n"
    assert hadolint(text, tmp_path) == []


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


@pytest.mark.skipif(shutil.which("sh") is None, reason="needs a POSIX sh")
def test_entrypoint_keygen_writes_a_key_once_or_the_given_one(tmp_path):
    """The compose stack cannot come up open: keygen gives the api a key on the first start and keeps it."""
    file = tmp_path / "api_key"
    first = run_entrypoint("keygen", str(file))
    assert first.returncode == 0, first.stderr
    key = file.read_text()
    assert re.fullmatch(r"[0-9a-f]{64}", key), key  # 32 random bytes
    assert Settings(_env_file=None, api_key_file=file, host="0.0.0.0").api_key_value() == key
    assert file.stat().st_mode & 0o777 == 0o600
    assert run_entrypoint("keygen", str(file)).returncode == 0
    assert file.read_text() == key  # kept: every restart and every replica serves the same key
    chosen = run_entrypoint("keygen", str(file), env={"SEQREC_API_KEY": "my-own-key-0123456789"})
    assert chosen.returncode == 0
    assert file.read_text() == "my-own-key-0123456789"  # a key set in .env wins (and rotates on `up`)
    assert key not in first.stderr  # read from the volume, never printed to the log
    assert run_entrypoint("keygen").returncode == 2
    assert [p.name for p in tmp_path.iterdir()] == ["api_key"]  # no temporary file left
