"""Record which releases of omnitts' dependencies an environment has, and tabulate tested ranges.

CI runs the test suite in two environments (the newest releases, and the oldest that pyproject.toml
allows, pinned by .ci/oldest.txt); after each passing run it records that environment's versions,
then prints the table that docs/compatibility.md carries and says whether the docs still match.

    python scripts/compat_table.py record OUT.json          # in each tested environment
    python scripts/compat_table.py table OLDEST.json NEWEST.json [--check docs/compatibility.md]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from importlib import metadata
from pathlib import Path

PACKAGES = ["torch", "transformers", "tokenizers", "huggingface_hub", "datasets", "pyarrow", "numpy", "librosa",
            "soundfile", "safetensors", "typer", "rich", "ray"]
BEGIN, END = "<!-- compat-table: begin -->", "<!-- compat-table: end -->"


def record(out: Path) -> None:
    versions = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "-"
    out.write_text(json.dumps(versions, indent=1) + "\n", encoding="utf-8")


def table(oldest: dict, newest: dict) -> str:
    rows = ["| package | oldest tested | newest tested |", "|---|---|---|"]
    rows += [f"| {name} | {oldest.get(name, '-')} | {newest.get(name, '-')} |" for name in ["python", *PACKAGES]]
    return "\n".join(rows)


def documented(doc: Path) -> str:
    text = doc.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        return ""
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="write this environment's versions as JSON")
    rec.add_argument("out", type=Path)
    tab = sub.add_parser("table", help="print the markdown table of two recorded environments")
    tab.add_argument("oldest", type=Path)
    tab.add_argument("newest", type=Path)
    tab.add_argument("--check", type=Path, help="say whether this document's table is the same")
    args = parser.parse_args(argv)
    if args.command == "record":
        record(args.out)
        return 0
    text = table(*(json.loads(p.read_text(encoding="utf-8")) for p in (args.oldest, args.newest)))
    print(text)
    if args.check:
        same = documented(args.check) == text
        print(f"{args.check}: {'matches this run' if same else 'differs from this run: paste the table above into it'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
