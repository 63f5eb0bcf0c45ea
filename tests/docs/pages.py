"""Reading a docs page's code blocks: its `seqrec` commands, its `curl` requests and its YAML, as the tests run them."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


def blocks(page: Path, lang: str) -> list[str]:
    return [body for kind, body in BLOCK.findall(page.read_text()) if kind == lang]


def command_lines(page: Path, program: str, langs: tuple[str, ...] = ("bash", "cron")) -> list[str]:
    """Every command of the page's shell blocks that runs ``program`` (continuation lines joined, comments cut,
    `&&` chains split, redirections and pipes cut, a cron line's schedule and `cd` dropped)."""
    found = []
    for lang in langs:
        for body in blocks(page, lang):
            for line in body.replace("\\\n", " ").splitlines():
                line = line.split(" # ")[0].strip()
                if lang == "cron":
                    line = " ".join(line.split()[5:])
                for part in re.split(r"\s&&\s|;\s|\s&\s", line):
                    part = re.split(r"\s[|>]\s|\s&$", part)[0].strip()  # the command, not its redirection
                    if part.startswith(f"{program} ") or part.startswith(f".venv/bin/{program} "):
                        found.append(part.removeprefix(".venv/bin/"))
    return found


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    body: Any

    @classmethod
    def from_curl(cls, line: str) -> Request:
        words = shlex.split(line)
        url = next(w for w in words[1:] if "localhost" in w or "127.0.0.1" in w)
        body = json.loads(words[words.index("-d") + 1]) if "-d" in words else None
        method = words[words.index("-X") + 1] if "-X" in words else ("POST" if body is not None else "GET")
        return cls(method, "/" + url.split("/", 1)[1] if "/" in url else "/", body)


def requests(page: Path) -> list[Request]:
    return [Request.from_curl(line) for line in command_lines(page, "curl")]


def yaml_blocks(page: Path) -> list[dict[str, Any]]:
    return [yaml.safe_load(body) for body in blocks(page, "yaml")]
