"""docs/reference/cli.md, generated from `offline.cli.seqrec.build_parser()`: every command, every flag."""

from __future__ import annotations

import argparse

from offline.cli.reference import commands, reference_anchor

HEADER = """# CLI reference

Generated from the argument parser (`offline/cli/seqrec.py:build_parser`) when the site is built, so every command
and every flag is here and none is hand-copied. `seqrec COMMAND --help` prints the same text and ends with a link to
its section. The options `--debug` and `-q/--quiet` are accepted by every command.
"""


def flags(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions
            if not isinstance(a, (argparse._SubParsersAction, argparse._HelpAction))]


def _cell(text: str | None) -> str:
    return (text or "").replace("|", "\\|").replace("\n", " ")


def _names(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    return ", ".join(f"`{name}`" for name in action.option_strings)


def _value(action: argparse.Action) -> str:
    if action.nargs == 0:
        return ""
    if action.choices is not None:
        return " \\| ".join(f"`{c}`" for c in action.choices)
    metavar = action.metavar if isinstance(action.metavar, str) else None
    return f"`{metavar or action.dest.upper()}`" + (" ..." if action.nargs in ("*", "+") else "")


def _default(action: argparse.Action) -> str:
    if action.nargs == 0 or action.default in (None, argparse.SUPPRESS) or action.required:
        return "required" if action.required else ""
    return f"`{action.default}`"


def _help(action: argparse.Action) -> str:
    if action.help is None:
        return ""
    if action.help == argparse.SUPPRESS:
        return "(hidden)"
    return _cell(argparse.HelpFormatter("seqrec")._expand_help(action))


def section(prog: str, parser: argparse.ArgumentParser) -> str:
    level = "#" * min(prog.count(" ") + 2, 5)  # seqrec: h2, its commands h3, the bench subcommands h4
    lines = [f"{level} `{prog}` {{#{reference_anchor(prog)}}}", ""]
    if parser.description:
        lines += [_cell(parser.description), ""]
    lines += ["```text", parser.format_usage().strip(), "```", ""]
    rows = flags(parser)
    if rows:
        lines += ["| flag | value | default | what it does |", "| --- | --- | --- | --- |"]
        lines += [f"| {_names(a)} | {_value(a)} | {_default(a)} | {_help(a)} |" for a in rows]
        lines.append("")
    return "\n".join(lines)


def summaries(parser: argparse.ArgumentParser, prog: str = "seqrec") -> dict[str, str]:
    """`seqrec train` -> the one line `seqrec --help` lists it with."""
    out: dict[str, str] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                out[f"{prog} {choice.dest}"] = choice.help or ""
            for name, sub in action.choices.items():
                out.update(summaries(sub, f"{prog} {name}"))
    return out


def render(parser: argparse.ArgumentParser) -> str:
    lines = summaries(parser)
    toc = ["| command | what it does |", "| --- | --- |"]
    toc += [f"| [`{prog}`](#{reference_anchor(prog)}) | {_cell(lines.get(prog))} |"
            for prog, _ in commands(parser) if prog != "seqrec"]
    body = [section(prog, sub) for prog, sub in commands(parser)]
    return "\n".join([HEADER, *toc, "", *body])
