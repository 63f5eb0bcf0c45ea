"""The README stays a README: at most 250 lines, its two set-up commands are the ones dev.sh and CI run, and every
link it makes resolves in the checkout."""

from __future__ import annotations

import re
from pathlib import Path

from tests.docs.pages import blocks

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def test_the_readme_is_short() -> None:
    assert len(README.read_text().splitlines()) <= 250


def test_the_two_set_up_commands_are_the_ones_dev_sh_and_ci_run() -> None:
    setup = blocks(README, "bash")[0]
    commands = [line.split("#")[0].strip() for line in setup.splitlines() if line.strip()]
    assert commands == ["./dev.sh demo", "./dev.sh test"]
    dev = (ROOT / "dev.sh").read_text()
    assert re.search(r"^\s+demo\) setup; demo ", dev, re.M)
    assert re.search(r"^\s+test\) setup; ", dev, re.M)
    ci = [line.split("#")[0].strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert "./dev.sh test" in ci  # CI runs the README's test command as written


def test_every_relative_link_of_the_readme_resolves() -> None:
    links = re.findall(r"\]\(([^)\s]+)\)", README.read_text())
    missing = [link for link in links if not link.startswith("http") and not (ROOT / link.split("#")[0]).exists()]
    assert links
    assert missing == []
