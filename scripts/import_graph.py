"""The import graph of omnitts: every import statement, at module level or inside a function, resolved.

    python scripts/import_graph.py            # the subpackage graph; exits 1 on any import circle

Two checks, both run by tests/test_architecture.py: no circle between modules, and none between
subpackages (each of omnitts/<package>/ counted as one node, top-level modules as themselves), so
e.g. models/ never imports device/ while device/ imports models/.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "omnitts"


def modules(root: Path) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package's __init__) for every .py file under `root`."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def edges(found: dict[str, tuple[Path, bool]]) -> dict[str, set[str]]:
    """Module -> the modules of the package it imports (`from pkg import name` counts as pkg.name where
    that is a module, else as pkg)."""
    graph = {}
    for name, (path, is_package) in found.items():
        base = name.split(".") if is_package else name.split(".")[:-1]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    anchor = base[: len(base) - node.level + 1]
                    target = ".".join(anchor + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    deps.add(sub if sub in found else target)
            elif isinstance(node, ast.Import):
                deps.update(alias.name for alias in node.names)
        graph[name] = {d for d in deps if d in found and d != name}
    return graph


def collapse(graph: dict[str, set[str]], depth: int = 2) -> dict[str, set[str]]:
    """The same graph with every module below `depth` dotted parts merged into its package."""
    def node(module: str) -> str:
        return ".".join(module.split(".")[:depth])

    merged: dict[str, set[str]] = {}
    for module, deps in graph.items():
        merged.setdefault(node(module), set()).update(node(d) for d in deps if node(d) != node(module))
    return merged


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def main() -> int:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else PACKAGE
    graph = edges(modules(root))
    packages = collapse(graph)
    for name in sorted(packages):
        print(f"{name} -> {', '.join(sorted(packages[name])) or '-'}")
    bad = circles(graph) + circles(packages)
    for circle in bad:
        print("import circle:", " <-> ".join(circle), file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
