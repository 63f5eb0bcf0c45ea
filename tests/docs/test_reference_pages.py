"""The generated reference pages hold what the code declares: every flag of every command (compared with the parser
itself), every route of the OpenAPI document, every key of the config models; `--help` links its section."""

from __future__ import annotations

import argparse
import re

import pytest

from docs_hooks import api_page, cli_page, models_page
from offline.cli.reference import commands, reference_anchor
from offline.cli.seqrec import build_parser
from retriever.config import RunConfig
from service.http.settings import Settings

PARSER = build_parser()
COMMANDS = list(commands(PARSER))


def _sections(page: str) -> dict[str, str]:
    """anchor -> the text of that command's section (up to the next command's heading)."""
    parts = re.split(r"^#{2,5} `[^`]+` \{#([a-z0-9-]+)\}$", page, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_every_command_has_a_section_with_every_one_of_its_flags() -> None:
    sections = _sections(cli_page.render(PARSER))
    assert set(sections) == {reference_anchor(prog) for prog, _ in COMMANDS}
    missing = []
    for prog, parser in COMMANDS:
        section = sections[reference_anchor(prog)]
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            names = action.option_strings or [action.metavar or action.dest]
            missing += [f"{prog} {name}" for name in names if f"`{name}`" not in section]
    assert missing == []
    assert len(COMMANDS) > 20  # the bench subcommands are walked too


def test_a_flag_added_to_the_parser_appears_on_the_page() -> None:
    parser = build_parser()
    train = dict(commands(parser))["seqrec train"]
    train.add_argument("--a-flag-no-page-names", help="added by the test")
    assert "`--a-flag-no-page-names`" in _sections(cli_page.render(parser))["seqrec-train"]


def test_every_help_ends_with_the_link_to_its_reference_section() -> None:
    unlinked = [prog for prog, parser in COMMANDS
                if not parser.format_help().rstrip().endswith(f"/reference/cli/#{reference_anchor(prog)}")]
    assert unlinked == []


def test_the_api_page_documents_every_route_and_schema() -> None:
    document = api_page.openapi_document()
    page = api_page.render(document)
    for path, item in document["paths"].items():
        for method in item:
            assert f"`{method.upper()} {path}`" in page
    for name in document["components"]["schemas"]:
        assert f"### {name} {{#{name.lower()}}}" in page
    assert "(API key)" in page  # rendered with a key: the keyed routes say so


def test_the_config_tables_name_every_key_with_its_default() -> None:
    runs = models_page.expand("<!-- seqrec:fields retriever.config:RunConfig -->")
    for section in ("model", "loss", "train"):
        for name in type(getattr(RunConfig(), section)).model_fields:
            assert f"| `{section}.{name}` |" in runs, name
    assert "| `train.lr` | float (> 0) | `0.001` |" in runs
    settings = models_page.expand("<!-- seqrec:fields service.http.settings:Settings SEQREC_ -->")
    assert all(f"| `SEQREC_{name.upper()}` |" in settings for name in Settings.model_fields)
    assert "| `model.d_model` |" in models_page.backbones()


def test_a_marker_naming_no_model_fails_the_build() -> None:
    with pytest.raises(AttributeError):
        models_page.expand("<!-- seqrec:fields retriever.config:NoSuchModel -->")


def test_every_config_key_has_a_description() -> None:
    from offline.jobs.pipeline_config import PipelineConfig

    for model, prefix in ((RunConfig, ""), (PipelineConfig, ""), (Settings, "SEQREC_")):
        undescribed = [key for key, _, _, text in models_page.rows(model, prefix) if not text]
        assert undescribed == [], model.__name__
