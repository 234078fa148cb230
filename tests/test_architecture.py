"""Imports point one way: no circle between omnitts' modules or between its subpackages."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def graph(load_script):
    return load_script("import_graph")


def test_no_import_circle_between_modules(graph):
    assert graph.circles(graph.edges(graph.modules(graph.PACKAGE))) == []


def test_no_import_circle_between_packages(graph):
    packages = graph.collapse(graph.edges(graph.modules(graph.PACKAGE)))
    assert graph.circles(packages) == []
    # The split the loader and the devices rely on: device/ prepares models/, never the other way.
    assert "omnitts.device" not in packages["omnitts.models"]
    assert "omnitts.models" in packages["omnitts.device"]


def test_the_check_finds_a_circle_made_by_a_function_level_import(graph, tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("def f():\n    from .sub.c import g\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "c.py").write_text("from ..a import b\n")
    modules = graph.edges(graph.modules(pkg))
    assert graph.circles(modules) == [["pkg.a", "pkg.b", "pkg.sub.c"]]
    # No circle between modules, one between packages: pkg.d -> pkg.sub.c, pkg.sub.e -> pkg.d.
    (pkg / "sub" / "c.py").write_text("X = 1\n")
    (pkg / "sub" / "e.py").write_text("import pkg.d\n")
    (pkg / "d.py").write_text("from .sub.c import X\n")
    modules = graph.edges(graph.modules(pkg))
    assert graph.circles(modules) == []
    assert graph.circles(graph.collapse(modules)) == [["pkg.d", "pkg.sub"]]


def test_the_script_exits_1_on_a_circle(graph, tmp_path, monkeypatch, capsys):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .b import x\n")
    (pkg / "b.py").write_text("from .a import y\n")
    monkeypatch.setattr("sys.argv", ["import_graph.py", str(pkg)])
    assert graph.main() == 1
    assert "pkg.a <-> pkg.b" in capsys.readouterr().err
    monkeypatch.setattr("sys.argv", ["import_graph.py"])
    assert graph.main() == 0
