"""What a page's figures are checked against: each section (a heading to the next) that links result files under
docs/results/ must quote only numbers those files hold.

A quoted number is a decimal (`0.0589`, `47.7`) or a number with thousands separators (`22,363`); plain integers
(seeds, epochs, ports, dates) are not checked. A decimal with d digits after the point is held when a number in the
files rounds to it at d digits (`0.058872` holds `0.0589`); one followed by `%` may also be held as a fraction
(`0.477` holds `47.7 %`). A linked folder lends every text file under it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"
LINK = re.compile(r"\]\(([^)\s]+)\)")
QUOTED = re.compile(r"(?<![\w.])(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+\.\d+)(?![\w.]*\d)(\s?%)?")
NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?(?:[eE][-+]?\d+)?")
TEXT_SUFFIXES = {".json", ".md", ".txt", ".csv", ".jsonl", ".yaml", ".yml", ".log"}
CODE = re.compile(r"```.*?```", re.S)
INLINE_CODE = re.compile(r"`[^`]*`")


@dataclass(frozen=True)
class Section:
    page: Path
    title: str
    text: str

    @property
    def label(self) -> str:
        return f"{self.page.relative_to(ROOT).as_posix()} :: {self.title}"


def sections(page: Path) -> list[Section]:
    """The page split at its headings (the text before the first one is titled `(top)`)."""
    out, title, lines = [], "(top)", []
    in_code = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if not in_code and re.match(r"#{1,6} ", line):
            out.append(Section(page, title, "\n".join(lines)))
            title, lines = line.lstrip("#").strip(), []
        else:
            lines.append(line)
    out.append(Section(page, title, "\n".join(lines)))
    return out


def result_files(section: Section) -> list[Path]:
    """The files under docs/results/ the section links (a folder: every text file under it)."""
    found: list[Path] = []
    for target in LINK.findall(section.text):
        path = (section.page.parent / target.split("#")[0]).resolve()
        if not path.is_relative_to(RESULTS) or not path.exists():
            continue
        candidates = sorted(path.rglob("*")) if path.is_dir() else [path]
        found += [p for p in candidates if p.is_file() and p.suffix in TEXT_SUFFIXES]
    return found


def quoted_numbers(text: str) -> list[tuple[str, bool]]:
    """(number as written, followed by %) for every checked number of the prose and tables (code left out)."""
    prose = INLINE_CODE.sub(" ", CODE.sub(" ", text))
    prose = LINK.sub(" ", prose)  # the link targets' names (results/two-stage/depth-200) are not figures
    return [(m.group(1), bool(m.group(2))) for m in QUOTED.finditer(prose)]


def held_values(files: list[Path]) -> list[float]:
    values = []
    for path in files:
        for token in NUMBER.findall(path.read_text(errors="replace")):
            try:
                values.append(float(token.replace(",", "")))
            except ValueError:
                continue
    return values


def _decimals(number: str) -> int:
    return len(number.split(".")[1]) if "." in number else 0


def is_held(number: str, percent: bool, values: list[float]) -> bool:
    want = float(number.replace(",", ""))
    d = _decimals(number)
    scales = (1.0, 100.0) if percent else (1.0,)
    tolerance = 0.5 * 10 ** -d + 1e-9
    return any(math.isclose(v * s, want, abs_tol=tolerance) or abs(v * s - want) <= tolerance
               for v in values for s in scales)


def unheld(section: Section) -> list[str]:
    """The section's quoted numbers that no file it links holds ([] for a section that links none)."""
    files = result_files(section)
    if not files:
        return []
    values = held_values(files)
    return [n + ("%" if p else "") for n, p in quoted_numbers(section.text) if not is_held(n, p, values)]


def unsourced(section: Section) -> bool:
    """A section that quotes numbers but links no result file."""
    return bool(quoted_numbers(section.text)) and not result_files(section)
