"""docs/architecture.md stays true: every module of analysis/, webapp/ and the client is in its "Every module"
table, and every module the table lists exists (scripts/module_index.py prints the table afresh); the
signatures its tables show are the code's, every ``module.name`` its prose passes through exists, and each
report stage returns the result the doc names (issue 31)."""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _index():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("module_index", ROOT / "scripts" / "module_index.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_module_is_in_the_architecture_doc_and_every_listed_one_exists() -> None:
    index = _index()
    doc = (ROOT / "docs" / "architecture.md").read_text()
    have = {p.as_posix() for p in index.modules()}
    listed = index.documented(doc)
    assert have - listed == set(), "add them: python3 scripts/module_index.py"
    assert listed - have == set(), "gone from the tree: regenerate the table"


def test_the_check_sees_a_module_the_doc_lacks() -> None:
    index = _index()
    doc = (ROOT / "docs" / "architecture.md").read_text()
    first = index.modules()[0].as_posix()
    assert first in index.documented(doc)
    assert first not in index.documented(doc.replace(f"| `{first}` |", "| removed |"))


# -- the prose: documented signatures, the names the flows pass through, the stages' results ----------
#
# Read with ``ast`` (no module is imported: webapp's need Django). A name is checked in every package
# it may belong to (``runs`` is both analysis/runs.py and webapp/snapshots/runs/runs.py): one is enough.
PACKAGES = (
    "analysis",
    "analysis/allocator",
    "webapp/snapshots",
    *(f"webapp/snapshots/{p}" for p in ("teams", "runs", "intake", "pages", "worker")),
    "webapp",
    "client/oomscope_client",
)
TYPE_WORDS = {"dict", "list", "str", "int", "bool", "tuple", "float", "bytes"}
SIGNATURE = re.compile(r"^([A-Za-z_][\w.]*)\((.*)\)\s*(?:->\s*(.+))?$")
DOTTED = re.compile(r"(?<![\w/.])([a-z_]\w*(?:\.[a-z_]\w*)*)\.([A-Za-z_]\w*)(?=\(|$|\s)")
DOC = (ROOT / "docs" / "architecture.md").read_text()
# Report keys the prose names that read like a module's name (contract.md): not code.
REPORT_KEYS = {"capture.doctor"}


def _module_files(name: str) -> list[Path]:
    out = []
    for base in PACKAGES:
        p = ROOT / base / Path(*name.split("."))
        if p.with_suffix(".py").is_file():
            out.append(p.with_suffix(".py"))
        elif (p / "__init__.py").is_file():
            out.append(p / "__init__.py")
    return out


def _top_names(path: Path) -> dict[str, ast.AST]:
    out: dict[str, ast.AST] = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            out.update((n.id, node) for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.ImportFrom, ast.Import)):
            out.update(((a.asname or a.name).split(".")[0], node) for a in node.names)
    return out


def _member(node: ast.AST | None, name: str) -> ast.AST | None:
    if not isinstance(node, ast.ClassDef):
        return None
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and item.name == name:
            return item
        targets = (
            item.targets if isinstance(item, ast.Assign) else [item.target] if isinstance(item, ast.AnnAssign) else []
        )
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return item
    return None


def _resolve(dotted: str) -> tuple[list[Path], ast.AST | None]:
    """The files ``dotted``'s module part may name, and the definition found in one of them."""
    parts = dotted.split(".")
    for k in range(len(parts) - 1, 0, -1):
        files = _module_files(".".join(parts[:k]))
        for path in files:
            node: ast.AST | None = _top_names(path).get(parts[k])
            for part in parts[k + 1 :]:
                node = _member(node, part)
            if node is not None:
                return files, node
        if files:
            return files, None
    return [], None


def _params(text: str) -> list[str]:
    """The parameter names a documented call shows (types such as ``CauseInput`` and ``...`` are no names)."""
    out, depth, cur = [], 0, ""
    for ch in text + ",":
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            name = re.split(r"[:=]", cur.strip())[0].strip()
            if re.fullmatch(r"[a-z_]\w*", name):
                out.append(name)
            cur = ""
        else:
            cur += ch
    return out


def _signature_problem(span: str, module: str) -> str | None:
    """What is wrong with a documented ``name(params) -> result`` of ``module``, or None."""
    m = SIGNATURE.match(span)
    if m is None:
        return None
    name, params, result = m.groups()
    files, node = _resolve(f"{module}.{name}")
    if node is None:
        return f"{module}.{name} is not defined in {[str(f.relative_to(ROOT)) for f in files]}"
    if isinstance(node, ast.ClassDef):
        node = _member(node, "__init__")
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    a = node.args
    real = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs if x.arg not in ("self", "cls")]
    shown = _params(params)
    if [p for p in real if p in shown] != shown:
        return f"{module}.{span}: its parameters are {real}"
    returns = ast.unparse(node.returns) if node.returns else ""
    words = [w for w in re.findall(r"[A-Za-z_]\w*", result or "") if w[0].isupper() or w in TYPE_WORDS]
    missing = [w for w in words if w not in returns and w != "None"]
    return f"{module}.{name} returns {returns!r}, the doc says {result!r}" if missing else None


def _entry_points() -> list[tuple[str, str]]:
    """(module, documented call) of the analysis/ table's "main entry points" column; a chained call
    ``Pool(jobs).submit(fn) -> Pending`` is two: ``Pool(jobs)`` and ``Pool.submit(fn) -> Pending``."""
    section = DOC.split("## analysis/", 1)[1].split("\n## ", 1)[0]
    out = []
    for line in section.splitlines():
        cols = [c.strip() for c in line.strip("|").split(" | ")] if line.startswith("| `") else []
        if len(cols) < 3:
            continue
        module = re.findall(r"`([^`]+)`", cols[0])[0].removesuffix(".py").rstrip("/").replace("/", ".")
        for span in re.findall(r"`([^`]+)`", cols[2].replace("\\|", "|")):
            head, sep, tail = span.partition(").")
            out += [(module, head + ")"), (module, head.split("(")[0] + "." + tail)] if sep else [(module, span)]
    return out


def test_the_documented_signatures_are_the_codes() -> None:
    problems = [p for module, span in _entry_points() if (p := _signature_problem(span, module))]
    assert len(_entry_points()) > 20
    assert problems == []


def test_every_module_dot_name_the_prose_passes_through_exists() -> None:
    prose = DOC.split("## Every module", 1)[0]
    names = {m.group(0) for span in re.findall(r"`([^`]+)`", prose) for m in DOTTED.finditer(span)}
    checked = [n for n in sorted(names - REPORT_KEYS) if not n.endswith((".py", ".html")) and _resolve(n)[0]]
    assert len(checked) > 40  # intake.admit, accept.upload_admit, steps.find_steps, stored.upgrade, ...
    assert [n for n in checked if _resolve(n)[1] is None] == []


def test_the_report_stages_return_what_the_doc_says() -> None:
    """Each ``stage.function`` -> ``Result`` the stages section names is a function of that module of
    ``analysis/stages/`` returning it; each private name it names is ``analysis/report.py``'s."""
    stages = DOC.split("### The report's stages", 1)[1].split("\n## ", 1)[0]
    flows = re.findall(r"`(\w+)\.(\w+)` -> `([\w.]+)`", stages)
    assert len(flows) >= 12
    for module, function, result in flows:
        path = ROOT / "analysis" / "stages" / f"{module}.py"
        assert path.is_file(), f"{module} is no module of analysis/stages/"
        node = _top_names(path).get(function)
        assert isinstance(node, ast.FunctionDef), f"{function} is not in analysis/stages/{module}.py"
        assert node.returns is not None and result.split(".")[-1] in ast.unparse(node.returns), (function, result)
    report = _top_names(ROOT / "analysis" / "report.py")
    named = set(re.findall(r"`(_\w+)`", stages))
    assert named and named - set(report) == set()


def test_the_prose_checks_see_a_wrong_name_and_a_wrong_signature() -> None:
    assert _resolve("intake.admit")[1] is not None
    assert _resolve("intake.admitted")[1] is None
    assert _resolve("allocator.recording.ReplaySource.get")[1] is not None
    assert _signature_problem("decide(result, capture) -> dict", "decision") is None
    assert _signature_problem("decide(dev, capture) -> dict", "decision") is not None
    assert _signature_problem("decide(result, capture) -> Decision", "decision") is not None
