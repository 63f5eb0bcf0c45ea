"""Each command's --help ends with a link to its section of the CLI reference (docs/reference/cli.md, which the docs
site generates from this same parser: docs_hooks/cli_page.py)."""

from __future__ import annotations

import argparse
import os
import re
import textwrap
from collections.abc import Iterator

# Where the built docs site is served. Until it is published somewhere, the address `./dev.sh docs` serves it on
# (mkdocs serve); SEQREC_DOCS_URL points the links at a published copy.
DOCS_URL = os.environ.get("SEQREC_DOCS_URL", "http://127.0.0.1:8001").rstrip("/")
CLI_PAGE = "reference/cli/"


def reference_anchor(prog: str) -> str:
    """`seqrec bench two-stage` -> `seqrec-bench-two-stage`: the section's id on the CLI page."""
    return re.sub(r"[^a-z0-9]+", "-", prog.lower()).strip("-")


def reference_link(prog: str) -> str:
    return f"{DOCS_URL}/{CLI_PAGE}#{reference_anchor(prog)}"


def commands(parser: argparse.ArgumentParser, prog: str = "seqrec") -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """(`seqrec train`, its parser) for the program and every (sub)command, depth first, in `--help` order."""
    yield prog, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from commands(sub, f"{prog} {name}")


class _KeepsLinks(argparse.HelpFormatter):
    """argparse's formatter, but wrapping never cuts a word at a hyphen or in its middle (the links)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        text = self._whitespace_matcher.sub(" ", text).strip()
        return textwrap.fill(text, width, initial_indent=indent, subsequent_indent=indent,
                             break_long_words=False, break_on_hyphens=False)


def add_reference_epilogs(parser: argparse.ArgumentParser) -> None:
    """End the help of the program and of every command with the link to its reference section."""
    for prog, command in commands(parser):
        link = f"Reference: {reference_link(prog)}"
        command.epilog = f"{command.epilog} {link}" if command.epilog else link
        command.formatter_class = _KeepsLinks
