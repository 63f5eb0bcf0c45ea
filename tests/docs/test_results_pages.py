"""A page may quote only figures its result files hold: every section that links result files under docs/results/
is checked number by number against them (tests/docs/sources.py says how). Two lists in known_gaps.txt may only
shrink: sections of the results pages and the README that quote figures but link no result file (`unsourced:`), and
figures of any page that the files their section links do not hold (`unheld:`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs.sources import ROOT, sections, unheld, unsourced

DOCS = ROOT / "docs"
RESULTS_PAGES = [ROOT / "README.md", *sorted((DOCS / "benchmarks").glob("*.md"))]
PAGES = [ROOT / "README.md", *sorted(p for p in DOCS.rglob("*.md") if not p.is_relative_to(DOCS / "results"))]
GAPS = Path(__file__).with_name("known_gaps.txt")


def _gaps(kind: str) -> set[str]:
    lines = GAPS.read_text().splitlines()
    return {line.split(": ", 1)[1].strip() for line in lines if line.startswith(f"{kind}: ")}


def _unheld() -> set[str]:
    return {f"{s.label} :: {n}" for page in PAGES for s in sections(page) for n in unheld(s)}


def test_every_figure_is_in_the_result_files_its_section_links() -> None:
    found, known = _unheld(), _gaps("unheld")
    assert found - known == set(), "figures the section's result files do not hold"
    assert known - found == set(), "held (or gone) now: take them off known_gaps.txt"


def test_results_sections_quoting_figures_link_their_result_files() -> None:
    found = {s.label for page in RESULTS_PAGES for s in sections(page) if unsourced(s)}
    known = _gaps("unsourced")
    assert found - known == set(), "figures without a linked result file"
    assert known - found == set(), "sourced (or gone) now: take it off known_gaps.txt"


def test_the_checks_run_on_the_results_pages() -> None:
    checked = [s for page in RESULTS_PAGES for s in sections(page) if not unsourced(s) and not unheld(s)]
    assert sum("±" in s.text or " ms" in s.text for s in checked) >= 10


def test_a_figure_its_file_does_not_hold_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    results = tmp_path / "docs" / "results" / "x"
    results.mkdir(parents=True)
    (results / "r.json").write_text('{"ndcg": 0.058872, "users": 22363, "share": 0.477}')
    page = tmp_path / "docs" / "benchmarks" / "p.md"
    page.parent.mkdir(parents=True)
    page.write_text("# P\n\n## Good\n\nNDCG@10 0.0589 over 22,363 users, 47.7 % of them "
                    "([r.json](../results/x/r.json)).\n\n## Bad\n\nNDCG@10 0.0601 "
                    "([r.json](../results/x/r.json)).\n\n## Unsourced\n\nNDCG@10 0.0601.\n")
    monkeypatch.setattr("tests.docs.sources.RESULTS", tmp_path / "docs" / "results")
    monkeypatch.setattr("tests.docs.sources.ROOT", tmp_path)
    found = {s.title: (unheld(s), unsourced(s)) for s in sections(page)}
    assert found["Good"] == ([], False)
    assert found["Bad"] == (["0.0601"], False)
    assert found["Unsourced"] == ([], True)
