"""The architecture, as tests: imports point one way, no module imports itself back, and no module or
function grows past the size where it starts doing two jobs.

Every import statement of `retriever`, `ranker`, `service` and `offline` is read with `ast`: module level,
inside functions (deferred imports still run, so they still tie the modules together) and under
`if TYPE_CHECKING:`. TYPE_CHECKING-only imports never run, so they are left out of the cycle check
(annotations between two modules that use each other's types are fine) but must still point the
allowed way. An import of `a.b.c` is an edge to `a.b.c` only, not to the packages above it: every
submodule would otherwise import its package's `__init__` and every package that re-exports a
submodule would be a cycle.

The rules (docs/ARCHITECTURE.md draws them):
- layers: retriever <- ranker <- service <- offline. A module imports its own layer and those below;
  nothing imports `offline` but `offline` itself (the CLI and the benches live there);
- the service loads, encodes and scores: nothing it imports, directly or through other modules, is a
  training module (TRAINING_MODULES);
- the HTTP layer (`service.http`) is the only importer of the web stack (WEB_PACKAGES: FastAPI, uvicorn,
  starlette), and the offline jobs (OFFLINE_JOBS) reach nothing of it, directly or through other modules: they
  call the served system as a library (`service.system`);
- no import cycle between modules;
- no module over MAX_MODULE_LINES lines, no function over MAX_FUNCTION_LINES lines, except the
  commented entries of the allow-lists below.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("common", "retriever", "ranker", "service", "offline")  # each may import itself and those before it
# The training loops: the retriever's optimiser loop and its distributed launcher, the ranker's fit, and
# the ranker's groups, features and losses as it trains on them. The service serves from
# artifacts and must not pull these in. `retriever.losses` is not here: it holds pure loss functions
# and the `LossName` type that `retriever.config` (which the artifact loader reads) names.
TRAINING_MODULES = frozenset({"retriever.train", "retriever.distributed", "ranker.train"})
HTTP_LAYER = "service.http"
WEB_PACKAGES = frozenset({"fastapi", "uvicorn", "starlette"})
OFFLINE_JOBS = ("offline.jobs", "offline.evaluation", "offline.data", "offline.tune")
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


# --- the walker ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    line: int
    type_checking: bool  # under `if TYPE_CHECKING:`: never runs

    def __str__(self) -> str:
        return f"{self.importer} -> {self.imported} (line {self.line}{', TYPE_CHECKING' if self.type_checking else ''})"


def module_files(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of the packages (a package is its __init__)."""
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _statements(tree: ast.AST, type_checking: bool = False) -> Iterable[tuple[ast.stmt, bool]]:
    """Every import statement anywhere in the tree, with whether it sits under `if TYPE_CHECKING:`."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, type_checking
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                yield from _statements(ast.Module(body=[child], type_ignores=[]), True)
            for child in node.orelse:
                yield from _statements(ast.Module(body=[child], type_ignores=[]), type_checking)
        else:
            yield from _statements(node, type_checking)


def _targets(node: ast.stmt, module: str, is_package: bool, modules: dict[str, Path]) -> list[str]:
    """The project modules one statement imports: `from a.b import c` is a.b.c where c is a module."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    assert isinstance(node, ast.ImportFrom)
    base = node.module or ""
    if node.level:  # relative: from the importer's package, one level up per extra dot
        package = module.split(".") if is_package else module.split(".")[:-1]
        anchor = package[: len(package) - (node.level - 1)]
        base = ".".join([*anchor, base] if base else anchor)
    return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]


def imports(root: Path, packages: Sequence[str]) -> list[Import]:
    """Every import from one module of the packages to another (imports of anything else left out)."""
    modules = module_files(root, packages)
    found = []
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node, type_checking in _statements(tree):
            for target in _targets(node, module, path.name == "__init__.py", modules):
                if target.split(".")[0] in packages and target != module:
                    found.append(Import(module, target, node.lineno, type_checking))
    return found


def external_imports(root: Path, packages: Sequence[str]) -> dict[str, set[str]]:
    """Module -> the top-level names of what it imports from outside the project (every kind of import statement,
    TYPE_CHECKING ones included: an annotation naming FastAPI still ties the module to it)."""
    out: dict[str, set[str]] = {}
    for module, path in module_files(root, packages).items():
        for node, _ in _statements(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and node.level:
                continue
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            out.setdefault(module, set()).update(n.split(".")[0] for n in names if n.split(".")[0] not in packages)
    return out


def in_package(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def wrong_way(found: Iterable[Import], layers: Sequence[str]) -> list[Import]:
    """Imports from a layer to one above it (TYPE_CHECKING ones included)."""
    rank = {layer: i for i, layer in enumerate(layers)}
    return [i for i in found if rank[i.imported.split(".")[0]] > rank[i.importer.split(".")[0]]]


def _graph(found: Iterable[Import]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for i in found:
        if not i.type_checking:
            graph.setdefault(i.importer, set()).add(i.imported)
            graph.setdefault(i.imported, set())
    return graph


def cycles(found: Iterable[Import]) -> list[list[str]]:
    """One cycle per strongly connected group of modules (Tarjan), as a path a -> b -> ... -> a."""
    graph = _graph(found)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(node: str) -> None:  # recursion depth is bounded by the number of modules (a few hundred)
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted((_cycle_in(group, graph) for group in groups), key=lambda c: c[0])


def _cycle_in(group: set[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest cycle through the group's first module (breadth-first), closed on itself."""
    start = min(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node] & group):
                if nxt == start:
                    return [*paths[node], start]
                if nxt not in paths:
                    paths[nxt] = [*paths[node], nxt]
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"no cycle through {start} in {sorted(group)}")  # a strong group always has one


def reaches(found: Iterable[Import], sources: Iterable[str], forbidden: frozenset[str]) -> list[list[str]]:
    """Import chains from a source module to a forbidden one (running imports only), one per forbidden
    module reached, shortest first."""
    graph = _graph(found)
    paths = {source: [source] for source in sorted(sources) if source in graph}
    frontier = list(paths)
    chains = []
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node]):
                if nxt not in paths:
                    paths[nxt] = [*paths[node], nxt]
                    following.append(nxt)
                    if nxt in forbidden:
                        chains.append(paths[nxt])
        frontier = following
    return chains


@dataclass(frozen=True)
class Oversized:
    where: str  # "path" for a module, "path:Qualified.name" for a function
    lines: int


def _long_functions(tree: ast.AST, rel: str, max_function: int) -> list[Oversized]:
    found = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                length = (child.end_lineno or child.lineno) - child.lineno + 1
                if not isinstance(child, ast.ClassDef) and length > max_function:
                    found.append(Oversized(f"{rel}:{name}", length))
                walk(child, name + ".")
            else:
                walk(child, prefix)

    walk(tree, "")
    return found


def oversized(root: Path, packages: Iterable[str], max_module: int, max_function: int) -> list[Oversized]:
    """Modules over max_module lines and functions (methods and nested ones too) over max_function."""
    found = []
    for path in module_files(root, packages).values():
        rel = path.relative_to(root).as_posix()
        text = path.read_text()
        if len(text.splitlines()) > max_module:
            found.append(Oversized(rel, len(text.splitlines())))
        found += _long_functions(ast.parse(text, filename=str(path)), rel, max_function)
    return found


# --- allowed exceptions ----------------------------------------------------------------------------
# Over the size limits, each with the reason it may stay. Empty: every module and function is within them.
ALLOWED_MODULES: dict[str, str] = {}
ALLOWED_FUNCTIONS: dict[str, str] = {}


@pytest.fixture(scope="module")
def found() -> list[Import]:
    return imports(ROOT, LAYERS)


# --- the tree ------------------------------------------------------------------------------------

def test_every_package_is_walked(found):
    modules = module_files(ROOT, LAYERS)
    assert {m.split(".")[0] for m in modules} == set(LAYERS)
    assert {i.importer.split(".")[0] for i in found} == set(LAYERS)
    assert set(modules) >= TRAINING_MODULES, "a training module was renamed: update TRAINING_MODULES"


def test_no_import_cycle(found):
    found_cycles = [" -> ".join(c) for c in cycles(found)]
    assert found_cycles == [], "import cycles:\n" + "\n".join(found_cycles)


def test_imports_point_one_way(found):
    against = [str(i) for i in wrong_way(found, LAYERS)]
    assert against == [], "imports against retriever <- ranker <- service <- offline:\n" + "\n".join(against)


def test_the_service_reaches_no_training_module(found):
    service = [m for m in module_files(ROOT, LAYERS) if m.split(".")[0] == "service"]
    chains = [" -> ".join(c) for c in reaches(found, service, TRAINING_MODULES)]
    assert chains == [], "the service imports a training module:\n" + "\n".join(chains)


def test_only_the_http_layer_imports_the_web_stack():
    importers = sorted(f"{module} imports {', '.join(sorted(names & WEB_PACKAGES))}"
                       for module, names in external_imports(ROOT, LAYERS).items()
                       if names & WEB_PACKAGES and not in_package(module, HTTP_LAYER))
    assert importers == [], f"only {HTTP_LAYER} may import {sorted(WEB_PACKAGES)}:\n" + "\n".join(importers)


def test_the_offline_jobs_reach_nothing_of_the_http_layer(found):
    jobs = [m for m in module_files(ROOT, LAYERS) if any(in_package(m, p) for p in OFFLINE_JOBS)]
    assert jobs, "an offline job package was renamed: update OFFLINE_JOBS"
    http = frozenset(m for m in module_files(ROOT, LAYERS) if in_package(m, HTTP_LAYER))
    chains = [" -> ".join(c) for c in reaches(found, jobs, http)]
    assert chains == [], f"an offline job imports the HTTP layer ({HTTP_LAYER}):\n" + "\n".join(chains)


def test_modules_and_functions_stay_small():
    over = [o for o in oversized(ROOT, LAYERS, MAX_MODULE_LINES, MAX_FUNCTION_LINES)
            if o.where not in ALLOWED_MODULES and o.where not in ALLOWED_FUNCTIONS]
    assert over == [], (f"over {MAX_MODULE_LINES} lines (module) or {MAX_FUNCTION_LINES} lines (function); "
                        "split it, or add it with a reason to ALLOWED_MODULES / ALLOWED_FUNCTIONS:\n"
                        + "\n".join(f"{o.where}: {o.lines} lines" for o in over))


def test_the_size_allow_lists_hold_only_offenders():
    # an entry whose module or function shrank (or went) must leave the list, so the list only shrinks
    over = {o.where for o in oversized(ROOT, LAYERS, MAX_MODULE_LINES, MAX_FUNCTION_LINES)}
    stale = sorted(set(ALLOWED_MODULES) - over) + sorted(set(ALLOWED_FUNCTIONS) - over)
    assert stale == [], "no longer over the limit; remove from the allow-list: " + ", ".join(stale)


# --- the walker itself, on tiny packages ---------------------------------------------------------

def write_tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


FAKE_LAYERS = ("low", "mid", "top")
CLEAN = {
    "low/__init__.py": "",
    "low/core.py": "import os\n\nimport low.util\n",
    "low/util.py": "",
    "mid/__init__.py": "from mid import work  # re-exports a submodule: not a cycle with mid.work\n",
    "mid/work.py": "from low import core\nfrom . import helpers\n\n\ndef go() -> None:\n    from low.util import x\n",
    "mid/helpers.py": "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from mid.work import go\n",
    "mid/train.py": "",
    "top/__init__.py": "",
    "top/cli.py": "import mid.work\nimport top\n",
}


def test_walker_reads_every_kind_of_import(tmp_path):
    found = imports(write_tree(tmp_path, CLEAN), FAKE_LAYERS)
    edges = {(i.importer, i.imported, i.type_checking) for i in found}
    assert edges == {
        ("low.core", "low.util", False),  # `import os` is not a project module: left out
        ("mid", "mid.work", False),  # `from mid import work`: the submodule, not the package
        ("mid.work", "low.core", False),
        ("mid.work", "mid.helpers", False),  # relative
        ("mid.work", "low.util", False),  # inside a function
        ("mid.helpers", "mid.work", True),  # under TYPE_CHECKING
        ("top.cli", "mid.work", False),
        ("top.cli", "top", False),
    }


def test_walker_passes_a_clean_tree(tmp_path):
    root = write_tree(tmp_path, CLEAN)
    found = imports(root, FAKE_LAYERS)
    assert cycles(found) == []  # mid.work <-> mid.helpers only under TYPE_CHECKING
    assert wrong_way(found, FAKE_LAYERS) == []
    assert reaches(found, ["mid.work"], frozenset({"mid.train"})) == []
    assert oversized(root, FAKE_LAYERS, 10, 5) == []


def test_walker_finds_a_cycle(tmp_path):
    root = write_tree(tmp_path, {**CLEAN, "low/util.py": "def f() -> None:\n    from low import core\n"})
    assert cycles(imports(root, FAKE_LAYERS)) == [["low.core", "low.util", "low.core"]]
    three = {**CLEAN, "mid/a.py": "import mid.b\n", "mid/b.py": "from .c import x\n", "mid/c.py": "from mid import a\n"}
    assert cycles(imports(write_tree(tmp_path / "three", three), FAKE_LAYERS)) == [["mid.a", "mid.b", "mid.c", "mid.a"]]


def test_walker_finds_a_wrong_way_import_even_under_type_checking(tmp_path):
    root = write_tree(tmp_path, {**CLEAN, "low/util.py": "from typing import TYPE_CHECKING\n\n"
                                                          "if TYPE_CHECKING:\n    import top.cli\n"})
    assert [str(i) for i in wrong_way(imports(root, FAKE_LAYERS), FAKE_LAYERS)] == [
        "low.util -> top.cli (line 4, TYPE_CHECKING)"]


def test_walker_finds_a_training_module_reached_through_another(tmp_path):
    root = write_tree(tmp_path, {**CLEAN, "low/util.py": "import mid.train\n"})
    found = imports(root, FAKE_LAYERS)
    assert reaches(found, ["top.cli"], frozenset({"mid.train"})) == [["top.cli", "mid.work", "low.util", "mid.train"]]


def test_walker_reads_external_imports(tmp_path):
    root = write_tree(tmp_path, {**CLEAN, "mid/web.py": "import fastapi.routing\nfrom uvicorn import run\n"
                                                        "from . import helpers\n\n\ndef f() -> None:\n"
                                                        "    from starlette.requests import Request\n"})
    found = external_imports(root, FAKE_LAYERS)
    assert found["mid.web"] == {"fastapi", "uvicorn", "starlette"}
    assert found["low.core"] == {"os"}  # project modules left out
    assert found["mid.helpers"] == {"typing"}


def test_walker_finds_long_modules_and_functions(tmp_path):
    body = "".join(f"        x{i} = {i}\n" for i in range(6))  # fill: its def line and 6 more
    text = f"class Box:\n    def fill(self) -> None:\n{body}\n\ndef short() -> None:\n    pass\n" + "\n" * 5
    assert len(text.splitlines()) == 17
    root = write_tree(tmp_path, {**CLEAN, "mid/long.py": text})
    assert oversized(root, FAKE_LAYERS, 10, 5) == [Oversized("mid/long.py", 17), Oversized("mid/long.py:Box.fill", 7)]
    assert oversized(root, FAKE_LAYERS, 17, 7) == []
