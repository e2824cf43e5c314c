"""Copy BokehJS from the installed bokeh package into ``static/bokeh/<version>/``.

Command (from the repository root, with the project's virtualenv):

    .venv/bin/python scripts/copy_bokehjs.py            # copy; prints the destination
    .venv/bin/python scripts/copy_bokehjs.py --check    # exit 1 if the copy is missing or stale

Pages load ``{% static 'bokeh/<version>/bokeh.min.js' %}`` (templatetag ``bokeh_js_url``,
from ``settings.BOKEH_VERSION``), so the JS always matches the Python package that
wrote the chart JSON: a json_item from one Bokeh version does not load in another.
Only the core bundle is copied: the charts use no widgets, tables, WebGL or MathJax.
Copies of other versions are removed. The copy is a build output: do not commit it.
"""

from __future__ import annotations

import argparse
import filecmp
import importlib.metadata
import importlib.util
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FILES = ("bokeh.min.js", "bokeh.js")


def bokeh_js_dir() -> tuple[str, Path]:
    """The installed bokeh's version and its BokehJS folder, found without importing bokeh."""
    spec = importlib.util.find_spec("bokeh")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(
            "bokeh is not installed in this Python; run `make install` (or pip install -r requirements.txt)"
        )
    package = Path(next(iter(spec.submodule_search_locations)))
    return importlib.metadata.version("bokeh"), package / "server" / "static" / "js"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check that the copy is present and current")
    parser.add_argument("--dest", type=Path, default=ROOT / "static" / "bokeh", help="default: static/bokeh")
    args = parser.parse_args(argv)

    version, source = bokeh_js_dir()
    target = args.dest / version
    stale = [
        name
        for name in FILES
        if not (target / name).is_file() or not filecmp.cmp(source / name, target / name, shallow=False)
    ]
    if args.check:
        if stale:
            print(f"BokehJS {version} copy missing or stale in {target}: {', '.join(stale)}", file=sys.stderr)
            return 1
        print(f"BokehJS {version} present in {target}")
        return 0
    target.mkdir(parents=True, exist_ok=True)
    for name in stale:
        shutil.copy2(source / name, target / name)
    for other in args.dest.iterdir():
        if other.is_dir() and other.name != version:
            shutil.rmtree(other)
    print(f"BokehJS {version} in {target} ({len(stale)} file(s) copied)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
