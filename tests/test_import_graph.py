"""The library's import graph: no cycle between its modules, imports inside functions included,
and the layers drawn in docs/architecture.md ("Import layers"), read from the drawing itself."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LIBRARY = REPO / "gating_core"
ARCHITECTURE = REPO / "docs" / "architecture.md"


# ------------------------------------------------------------------------------- the graph

def module_files(root: Path) -> dict[str, tuple[Path, bool]]:
    """{dotted module name: (file, is a package)} of every module under the package ``root``."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return modules


def imports_of(path: Path, name: str, is_package: bool) -> dict[str, int]:
    """Every module ``path`` imports, anywhere in the file (inside functions too), relative
    imports resolved: {dotted name as written, or with the imported name appended: line}."""
    package = name if is_package else name.rpartition(".")[0]
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.setdefault(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            found.setdefault(module, node.lineno)
            for alias in node.names:  # ``from package import module``
                found.setdefault(f"{module}.{alias.name}", node.lineno)
    return found


def import_graph(root: Path, extra_edges: dict | None = None) -> dict[str, dict[str, int]]:
    """{module: {module of the same library it imports: line of the import}}.

    A name resolves to the longest module it starts with (``gating_core.fcs.read_fcs`` is the
    package ``gating_core.fcs``). A package's ``__init__`` importing its own modules is an edge
    like any other; a module's implicit import of its parent packages is no statement and is not
    counted. ``extra_edges`` adds imports made by name (``importlib``)."""
    modules = module_files(root)
    graph = {}
    for name, (path, is_package) in modules.items():
        edges = {}
        for imported, line in imports_of(path, name, is_package).items():
            while imported and imported not in modules:
                imported = imported.rpartition(".")[0]
            if imported and imported != name:
                edges.setdefault(imported, line)
        graph[name] = edges
    for name, targets in (extra_edges or {}).items():
        for target in targets:
            graph[name].setdefault(target, 0)
    return graph


def find_cycle(graph: dict[str, dict[str, int]]) -> list[str] | None:
    """One import cycle ``[a, b, ..., a]`` (a imports b ...), or None."""
    state: dict[str, str] = {}  # "open" while on the path, "done" when finished
    for start in sorted(graph):
        if start in state:
            continue
        path, stack = [start], [iter(sorted(graph[start]))]
        state[start] = "open"
        while stack:
            following = next(stack[-1], None)
            if following is None:
                state[path.pop()] = "done"
                stack.pop()
            elif state.get(following) == "open":
                return path[path.index(following):] + [following]
            elif following not in state:
                state[following] = "open"
                path.append(following)
                stack.append(iter(sorted(graph[following])))
    return None


def describe_cycle(cycle: list[str], graph: dict[str, dict[str, int]]) -> str:
    steps = [f"{a} imports {b} (line {graph[a][b]})" for a, b in zip(cycle, cycle[1:])]
    return "import cycle: " + " -> ".join(cycle) + "\n  " + "\n  ".join(steps)


def library_graph() -> dict[str, dict[str, int]]:
    from gating_core.cli import COMMANDS

    # The command line loads its command modules by name (importlib), on first use.
    by_name = {"gating_core.cli": {f"gating_core.commands.{m}" for m in COMMANDS.values()}}
    return import_graph(LIBRARY, by_name)


# ------------------------------------------------------------------------------- the layers

def drawn_layers(text: str) -> dict[str, tuple[int, int | None]]:
    """{token: (layer, column or None)} from the drawing of docs/architecture.md's "Import
    layers": rows ``N label | tokens | tokens |`` and their continuation rows ``| ... |``;
    a column is given only where the layer is split."""
    section = text.split("## Import layers", 1)[1]
    drawing = section.split("```", 2)[1]
    placed, layer = {}, None
    for row in drawing.splitlines():
        stripped = row.strip()
        if not stripped or stripped.startswith("+"):
            continue
        number = re.match(r"(\d+)\s", stripped)
        if number:
            layer = int(number.group(1))
        cells = row.split("|")[1:-1]
        for column, cell in enumerate(cells):
            for token in cell.split():
                assert token not in placed, f"{token} is drawn twice"
                placed[token] = (layer, column if len(cells) > 1 else None)
    return placed


def token_of(module: str, placed: dict) -> str | None:
    """The drawing's token for ``module``: its own (``cli``, ``library/privacy``), else its
    nearest package's (``fcs/``); ``__init__`` is the library's own package file."""
    if module == "gating_core":
        return "__init__" if "__init__" in placed else None
    parts = module.split(".")[1:]
    if "/".join(parts) in placed:
        return "/".join(parts)
    for k in range(len(parts), 0, -1):
        if "/".join(parts[:k]) + "/" in placed:
            return "/".join(parts[:k]) + "/"
    return None


# ------------------------------------------------------------------------------- the tests

def test_the_graph_sees_function_level_and_relative_imports(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("from .low import VALUE\n")
    (package / "sub" / "low.py").write_text("VALUE = 1\n\ndef late():\n    from ..top import run\n    return run\n")
    (package / "top.py").write_text("import pkg.sub\n\n\ndef run():\n    return pkg.sub.VALUE\n")
    graph = import_graph(package)
    assert graph["pkg.sub.low"] == {"pkg.top": 4}  # inside a function, relative, two levels up
    assert graph["pkg.top"] == {"pkg.sub": 1}
    assert graph["pkg.sub"] == {"pkg.sub.low": 1}  # a package importing its own module counts
    cycle = find_cycle(graph)
    assert cycle is not None and set(cycle) == {"pkg.sub", "pkg.sub.low", "pkg.top"}
    assert "pkg.sub.low imports pkg.top (line 4)" in describe_cycle(cycle, graph)
    assert find_cycle({"a": {"b": 1}, "b": {"c": 1}, "c": {}}) is None


def test_the_library_has_no_import_cycle_even_through_imports_inside_functions():
    graph = library_graph()
    # the graph is real: module-level and function-level imports alike are in it
    assert {"gating_core.model.transfer", "gating_core.model.file"} <= set(graph["gating_core.model.estimator"])
    assert "gating_core.method.classifier" in graph["gating_core.model.transfer"]
    assert "gating_core.method.dica" in graph["gating_core.model.preprocessing"]  # imported inside a method
    cycle = find_cycle(graph)
    assert cycle is None, describe_cycle(cycle, graph)


def test_every_import_follows_the_layers_drawn_in_the_architecture_page():
    placed = drawn_layers(ARCHITECTURE.read_text(encoding="utf-8"))
    graph = library_graph()
    unplaced = sorted(m for m in graph if token_of(m, placed) is None)
    assert unplaced == [], f"modules missing from the drawing in {ARCHITECTURE.name}: {unplaced}"
    used = {token_of(m, placed) for m in graph}
    assert sorted(set(placed) - used) == [], "the drawing names modules that do not exist"
    wrong = []
    for module, imports in sorted(graph.items()):
        layer, column = placed[token_of(module, placed)]
        for imported, line in sorted(imports.items()):
            below, its_column = placed[token_of(imported, placed)]
            upwards = below > layer
            across = below == layer and None not in (column, its_column) and column != its_column
            if upwards or across:
                wrong.append(f"{module} (layer {layer}) imports {imported} (layer {below}) at line {line}")
    assert wrong == [], "\n".join(wrong)


def test_the_library_never_imports_the_app_and_ui_never_imports_pages():
    def imports_above(root: Path, above: tuple) -> list:
        return [f"{name} imports {imported} (line {line})"
                for name, (path, is_package) in module_files(root).items()
                for imported, line in imports_of(path, name, is_package).items() if imported.split(".")[0] in above]

    assert imports_above(LIBRARY, ("ui", "pages", "app")) == []
    assert imports_above(REPO / "ui", ("pages", "app")) == []
