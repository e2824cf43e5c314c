"""Print docs/architecture.md's "Every module" table: each module's path and the first line of its docstring.

    python3 scripts/module_index.py          # the table, to paste over the section
    python3 scripts/module_index.py --check  # exit 1 when the doc's table and the tree differ (tests do this)
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("analysis", "webapp", "client/oomscope_client")
SECTION = "## Every module"


def modules() -> list[Path]:
    out = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" in path.parts or path.name == "__init__.py":
                continue
            out.append(path.relative_to(ROOT))
    return out


def first_line(path: Path) -> str:
    doc = ast.get_docstring(ast.parse((ROOT / path).read_text())) or ""
    line = doc.strip().splitlines()[0] if doc.strip() else "(no docstring)"
    return line.replace("|", "\\|")


def table() -> str:
    rows = [f"| `{p.as_posix()}` | {first_line(p)} |" for p in modules()]
    return "\n".join(["| module | what it holds (its docstring's first line) |", "|---|---|", *rows])


def documented(doc: str) -> set[str]:
    """The module paths in the doc's "Every module" section."""
    section = doc.split(SECTION, 1)[1] if SECTION in doc else ""
    section = section.split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([^`]+\.py)` \|", section, flags=re.M))


def main(argv: list[str]) -> int:
    if argv[:1] == ["--check"]:
        doc = (ROOT / "docs" / "architecture.md").read_text()
        have = {p.as_posix() for p in modules()}
        listed = documented(doc)
        for p in sorted(have - listed):
            print(f"missing from docs/architecture.md: {p}")
        for p in sorted(listed - have):
            print(f"listed in docs/architecture.md but gone: {p}")
        return 1 if have != listed else 0
    print(table())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
