"""The MkDocs hooks (mkdocs.yml `hooks:`): add the generated reference pages and fill the field-table markers.

MkDocs loads this file by its path, so the checkout's root goes on sys.path first: the pages are built from this
checkout's code, never from another installed copy.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from mkdocs.structure.files import File, Files  # noqa: E402

from docs_hooks import api_page, cli_page, models_page  # noqa: E402

GENERATED = {"reference/cli.md": lambda: cli_page.render(_parser()),
             "reference/api.md": lambda: api_page.render(api_page.openapi_document())}


def _parser() -> Any:
    from offline.cli.seqrec import build_parser

    return build_parser()


def on_files(files: Files, config: Any) -> Files:
    for path, render in GENERATED.items():
        files.append(File.generated(config, path, content=render()))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    return models_page.expand(markdown)
