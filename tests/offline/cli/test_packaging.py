"""The wheel: what `pip install seqrec` (and the Docker images) get must run `seqrec demo` outside a checkout,
and its artifacts must not claim the commit of whatever git repository it happens to be installed in."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SOURCES = ("common", "retriever", "ranker", "service", "offline", "configs", "setup.py", "pyproject.toml", "README.md")


def _build_wheel(tmp_path: Path) -> Path:
    """Build from a copy, so the build's own folders (build/, *.egg-info) never land in the checkout."""
    src = tmp_path / "src"
    src.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(ROOT / name, src / name)
    out = tmp_path / "wheel"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                    "--wheel-dir", str(out), str(src)], check=True, capture_output=True, text=True)
    (wheel,) = out.glob("seqrec-*.whl")
    return wheel


def test_the_installed_wheel_finds_the_demo_configs(tmp_path: Path) -> None:
    wheel = _build_wheel(tmp_path)
    names = set(zipfile.ZipFile(wheel).namelist())
    configs = {f"offline/configs/{p.relative_to(ROOT / 'configs').as_posix()}"
               for p in (ROOT / "configs").rglob("*.yaml")}
    assert configs <= names, sorted(configs - names)
    assert {"service/http/static/index.html", "service/http/static/app.js"} <= names

    # installed into a venv-like folder inside the user's own git repository
    user_repo = tmp_path / "user-repo"
    subprocess.run(["git", "init", "-q", str(user_repo)], check=True)
    subprocess.run(["git", "-c", "user.name=u", "-c", "user.email=u@example.com", "commit", "-q", "--allow-empty",
                    "-m", "the user's work"], cwd=user_repo, check=True)
    site = user_repo / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", "--target", str(site),
                    str(wheel)], check=True, capture_output=True, text=True)
    # From a folder with no configs/, importing the installed copy ahead of the checkout's editable install:
    # each pipeline `seqrec demo` runs loads, and so does the retriever config it names.
    probe = """
import json, sys
from offline.cli.common import default_configs_dir, shipped_configs
from offline.jobs.pipeline import load_pipeline_config
from retriever.config import load_config
found = {}
for name in ("demo.yaml", "ml-100k-download.yaml"):
    config = load_pipeline_config(shipped_configs() / "pipeline" / name)
    load_config(config.retriever)
    found[name] = str(config.retriever)
from retriever.artifact import _git_sha
print(json.dumps({"dir": str(shipped_configs()), "lookup": str(default_configs_dir()), "retrievers": found,
                  "git_sha": _git_sha()}))
"""
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}
    result = subprocess.run([sys.executable, "-c", probe], cwd=work, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout.splitlines()[-1])
    assert Path(found["dir"]) == site / "offline" / "configs"
    assert Path(found["lookup"]) == site / "offline" / "configs"  # `seqrec bench --models NAME` finds them too
    for retriever in found["retrievers"].values():
        assert Path(retriever).is_relative_to(site), retriever
    assert found["git_sha"] is None  # not the user's repository's commit
