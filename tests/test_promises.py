"""Every user-facing promise in the docs names the test that proves it (issue 36).

A promise is tagged where it is made, `<!-- promise: some-id -->` right after the sentence, in README.md,
docs/*.md or recipes/README.md. docs/promises.md has one table row per id: the id, the promise in a few
words, the files that tag it and the tests (`tests/test_x.py::test_name`). A test not yet on main (another
branch adds it) is written with ` (pending: BRANCH)` after it; once the test exists the mark must go.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TABLE = "docs/promises.md"
TAG = re.compile(r"<!--\s*promise:\s*([a-z0-9][a-z0-9-]*)\s*-->")
TEST_REF = re.compile(r"`(tests/[\w/]+\.py)::([\w\[\]:.,=-]+)`( \(pending: [\w-]+\))?")


def tagged_files(root: Path = ROOT) -> list[str]:
    """The files whose promises are tagged, relative to `root` (the table itself is not one)."""
    paths = [root / "README.md", root / "recipes" / "README.md", *sorted((root / "docs").glob("*.md"))]
    return [p.relative_to(root).as_posix() for p in paths if p.exists() and p.relative_to(root).as_posix() != TABLE]


def find_tags(texts: dict[str, str]) -> dict[str, set[str]]:
    """{id: the files that tag it} from {file: text}."""
    tags: dict[str, set[str]] = {}
    for name, text in texts.items():
        for match in TAG.finditer(text):
            tags.setdefault(match.group(1), set()).add(name)
    return tags


def tags_in_code(name: str, text: str) -> list[str]:
    """Tags inside fenced code blocks, where they would show (and break the code): `file:line` each."""
    found, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif fenced and TAG.search(line):
            found.append(f"{name}:{number}: a promise tag inside a code block (put it after the block)")
    return found


def parse_table(text: str) -> list[dict]:
    """The table's rows: {line, id, where (set of files), tests [(file, name, pending)]}. A row is a
    Markdown table line whose first cell is a backticked id; header and separator lines are skipped."""
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.lstrip().startswith("|") else []
        if len(cells) != 4 or not re.fullmatch(r"`[a-z0-9][a-z0-9-]*`", cells[0]):
            continue
        tests = [(m.group(1), m.group(2), bool(m.group(3))) for m in TEST_REF.finditer(cells[3])]
        where = {w.strip().strip("`") for w in cells[2].split(",") if w.strip()}
        rows.append(dict(line=number, id=cells[0].strip("`"), where=where, tests=tests, cell=cells[3]))
    return rows


def defined_tests(source: str) -> set[str]:
    """The test names a test file defines: `test_x` and `TestClass::test_x`."""
    names = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            names |= {f"{node.name}::{f.name}" for f in node.body
                      if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.name.startswith("test_")}
    return names


def problems(texts: dict[str, str], table: str, tests: dict[str, set[str]]) -> list[str]:
    """Everything wrong between the tagged docs, the table and the test files; [] when they agree.
    `tests` maps a test file's path to the names it defines (a missing file maps to nothing)."""
    tags, rows, found = find_tags(texts), parse_table(table), []
    for name, text in texts.items():
        found += tags_in_code(name, text)
    seen: dict[str, int] = {}
    for row in rows:
        where = f"{TABLE}:{row['line']}: {row['id']}"
        if row["id"] in seen:
            found.append(f"{where}: duplicate row (first on line {seen[row['id']]})")
            continue
        seen[row["id"]] = row["line"]
        if row["id"] not in tags:
            found.append(f"{where}: no <!-- promise: {row['id']} --> tag in {', '.join(texts)}")
        elif row["where"] != tags[row["id"]]:
            found.append(f"{where}: 'where' says {', '.join(sorted(row['where']))}; "
                         f"the tag is in {', '.join(sorted(tags[row['id']]))}")
        if not row["tests"]:
            found.append(f"{where}: no test named (write `tests/test_x.py::test_name`)")
        for path, name, pending in row["tests"]:
            exists = re.sub(r"\[.*\]$", "", name) in tests.get(path, set())
            if pending and exists:
                found.append(f"{where}: {path}::{name} exists now: drop its '(pending: ...)' mark")
            elif not pending and not exists:
                found.append(f"{where}: {path}::{name}: no such test")
    for name in sorted(set(tags) - set(seen)):
        found.append(f"{', '.join(sorted(tags[name]))}: promise {name!r} has no row in {TABLE}")
    return found


def _repo_state():
    texts = {name: (ROOT / name).read_text(encoding="utf-8") for name in tagged_files()}
    tests = {p.relative_to(ROOT).as_posix(): defined_tests(p.read_text(encoding="utf-8"))
             for p in (ROOT / "tests").glob("**/test_*.py")}
    return texts, (ROOT / TABLE).read_text(encoding="utf-8"), tests


def test_every_promise_in_the_docs_has_a_row_and_every_named_test_exists():
    texts, table, tests = _repo_state()
    assert find_tags(texts), "no promise tags found: the pattern or the file list is wrong"
    assert problems(texts, table, tests) == []


SYNTHETIC_DOC = "Re-runs resume. <!-- promise: resume -->\nExit 2 on bad options.<!--promise: exit-2-->\n"
SYNTHETIC_TABLE = """\
| id | promise | where | tests |
|---|---|---|---|
| `resume` | a re-run resumes | README.md | `tests/test_cli.py::test_rerun[wav]`, `tests/test_cli.py::TestX::test_y` |
| `exit-2` | bad options exit 2 | README.md | `tests/test_cli.py::test_exit` |
"""
SYNTHETIC_TESTS = {"tests/test_cli.py": defined_tests(
    "import pytest\n@pytest.mark.parametrize('f', ['wav'])\ndef test_rerun(f): pass\n"
    "def test_exit(): pass\nclass TestX:\n    def test_y(self): pass\n")}


def test_the_checker_accepts_an_agreeing_table():
    assert problems({"README.md": SYNTHETIC_DOC}, SYNTHETIC_TABLE, SYNTHETIC_TESTS) == []


def test_the_checker_finds_a_missing_row_test_tag_and_duplicate():
    doc = SYNTHETIC_DOC + "Never half-written. <!-- promise: atomic -->\n"
    assert problems({"README.md": doc}, SYNTHETIC_TABLE, SYNTHETIC_TESTS) == [
        "README.md: promise 'atomic' has no row in docs/promises.md"]

    no_test = SYNTHETIC_TABLE.replace("test_exit`", "test_exit_code`")
    assert problems({"README.md": SYNTHETIC_DOC}, no_test, SYNTHETIC_TESTS) == [
        "docs/promises.md:4: exit-2: tests/test_cli.py::test_exit_code: no such test"]

    untagged = SYNTHETIC_DOC.replace("<!--promise: exit-2-->", "")
    assert problems({"README.md": untagged}, SYNTHETIC_TABLE, SYNTHETIC_TESTS) == [
        "docs/promises.md:4: exit-2: no <!-- promise: exit-2 --> tag in README.md"]

    twice = SYNTHETIC_TABLE + "| `resume` | again | README.md | `tests/test_cli.py::test_exit` |\n"
    assert problems({"README.md": SYNTHETIC_DOC}, twice, SYNTHETIC_TESTS) == [
        "docs/promises.md:5: resume: duplicate row (first on line 3)"]

    fenced = SYNTHETIC_DOC + "```bash\nomnitts synth  # <!-- promise: resume -->\n```\n"
    assert problems({"README.md": fenced}, SYNTHETIC_TABLE, SYNTHETIC_TESTS) == [
        "README.md:4: a promise tag inside a code block (put it after the block)"]

    moved = problems({"docs/outputs.md": SYNTHETIC_DOC}, SYNTHETIC_TABLE, SYNTHETIC_TESTS)
    assert moved[0] == "docs/promises.md:3: resume: 'where' says README.md; the tag is in docs/outputs.md"


def test_the_checker_holds_pending_tests_to_their_mark():
    pending = SYNTHETIC_TABLE.replace("test_exit`", "test_version` (pending: cli)")
    assert problems({"README.md": SYNTHETIC_DOC}, pending, SYNTHETIC_TESTS) == []
    landed = {"tests/test_cli.py": SYNTHETIC_TESTS["tests/test_cli.py"] | {"test_version"}}
    assert problems({"README.md": SYNTHETIC_DOC}, pending, landed) == [
        "docs/promises.md:4: exit-2: tests/test_cli.py::test_version exists now: drop its '(pending: ...)' mark"]
