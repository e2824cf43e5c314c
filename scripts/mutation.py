"""Mutation testing of the core rules with mutmut (`make mutation`), each module against its own tests.

For every target below: copy the working tree (tracked and untracked-but-not-ignored files) to a
temporary folder, point mutmut at one source file, mutate only the functions that hold the rules
(mutant-name globs), run only that target's tests, within a time budget. Then print, and write to
``var/mutation/``, the kill rate per target and every surviving mutant's diff.

Why a fresh copy per target: mutmut reads its settings from ``pyproject.toml`` and keeps its
state in ``mutants/`` of the current folder, and a test subset is a setting, so each target
needs its own. Two changes to the copy make mutmut's mutated tree the one the tests import:
``pythonpath = ["."]`` goes (it would put the original sources first on ``sys.path``) and
pytest-django's ``django_find_project`` is off (it would add the folder holding
``manage.py``, the original tree, too).

Usage: ``python scripts/mutation.py [TARGET ...] [--budget SECONDS] [--jobs N] [--keep] [--only MUTANT ...]``
(``--list`` names the targets). Kill rate = (killed + timeout) / (all mutants tried); a mutant
without tests (no selected test reaches its function) counts as not killed.
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "var" / "mutation"

# mutmut's exit-code classes (mutmut.stats.status_by_exit_code, 3.8).
KILLED = {1, 3}
TIMEOUT = {24, -24, 36, 152, 255}
SURVIVED = {0}
NO_TESTS = {5, 33}


@dataclass(frozen=True)
class Target:
    name: str
    source: str  # one file
    functions: tuple[str, ...]  # function or Class.method names (fnmatch patterns)
    tests: tuple[str, ...]  # test files; missing ones are left out (the "before" run)
    budget_s: int  # wall-clock cap for this target
    # Function -> regex: in that (long) function only the lines matching it are mutated; the rest
    # get mutmut's "# pragma: no mutate" in the temporary copy. Used for the hot loops, where most
    # lines are bookkeeping and the rules sit in a few.
    rule_lines: tuple[tuple[str, str], ...] = ()
    # mutmut's timeout_multiplier (default 15): a mutant's CPU-time limit is
    # ceil((its tests' stats-run seconds + 1) * multiplier * 2). Lowered where a target's mutants
    # include endless loops whose tests are slow, each of which would otherwise hold a worker for
    # 30 times those tests' time.
    timeout_multiplier: float | None = None


TARGETS = (
    Target(
        "config",  # the size and split rules of the allocator
        "analysis/allocator/config.py",
        (
            "AllocatorConfig.divisions_for",
            "AllocatorConfig.round_size",
            "AllocatorConfig.allocation_size",
            "AllocatorConfig.should_split",
            "AllocatorConfig.block_fits",
            "AllocatorConfig.round_sizes",
            "is_small",
            "_roundup_power2_next_division",
        ),
        ("tests/analysis/test_config.py", "tests/analysis/test_size_rules.py", "tests/analysis/test_blocks.py"),
        90,  # 43 s measured (load 2); was 150 before the dead code went
    ),
    Target(
        "allocator",  # the policy model's block rules: best fit, split, merge, segments, flushes, GC
        "analysis/allocator/cachestate.py",
        (
            "_Allocator.get_free_block",
            "_Allocator.miss",
            "_Allocator.split",
            "_Allocator.free_block",
            "_Allocator.alloc_block",
            "_Allocator._release_block",
            "_Allocator.release_available",
            "_Allocator.release_cached",
            "_Allocator._release_pool",
            "_Allocator.garbage_collect",
        ),
        ("tests/analysis/test_blocks.py", "tests/analysis/test_allocator.py"),
        360,
    ),
    Target(
        "allocator-loop",  # the same rules inlined in the policy model's hot loop (``_Model.run``)
        "analysis/allocator/cachemodel.py",
        ("_Model.run",),
        ("tests/analysis/test_blocks.py", "tests/analysis/test_allocator.py"),
        240,
        (
            (
                "_Model.run",
                # best fit and its max_split_size filter, the expandable walk, the split rule and
                # the split itself, the merges of a free
                r"split_|per_pool|mss|nsr|\brem\b|bisect\(kl|i < |i \+ 1|cur\b|nxt|p\[4\]|n\[4\]|nb\[4\]"
                r"|s \+=|b\[0\] =|b\[4\] =|\ba = b|r = \[|key = |fast =|exp_hit =",
            ),
        ),
    ),
    Target(
        "replay",  # the recorded replay's split and merge (its inline loop and the slow path)
        "analysis/allocator/replayer.py",
        ("_Replayer.run", "_Replayer._alloc_slow"),
        # test_blocks.py's recorded-replay tests, not the whole file: its policy-model tests
        # reach the replay too (through build_report) and would run for every mutant.
        (
            "tests/analysis/test_replay.py",
            "tests/analysis/test_blocks.py::test_recorded_replay_end_state_equals_the_final_segments_with_addresses",
            "tests/analysis/test_blocks.py::test_recorded_replay_inlined_split_and_merge_equal_the_called_rules",
            "tests/analysis/test_blocks.py::test_oom_free_blocks_named_by_the_report_are_those_of_the_rebuilt_state",
        ),
        360,  # all 202 in 216 s at load 2-3.6 (750 s at load 3-7)
        (
            (
                "_Replayer.run",
                # rounding, the split rule and the split, the merges with free neighbours
                r"\br = |\brem\b|mss|exp_active|small|\bnf\b|\bns = |\bps = |psz|\bend\b|\bstart\b|\bm = "
                r"|seg_size|free_sz|free_end|bs\[",
            ),
        ),
    ),
    Target(
        "oom",
        "analysis/oom.py",
        ("*",),
        ("tests/analysis/test_oom_fields.py", "tests/analysis/test_oom.py"),
        240,  # all 225 in 52-60 s at load 0.7-1.3 (docs/testing.md, third round)
        timeout_multiplier=2.0,
    ),
    Target(
        "upload-fields",  # what an upload keeps of run and tags
        "webapp/snapshots/intake/store.py",
        ("upload_create",),
        ("tests/webapp/test_access_rules.py", "tests/webapp/test_api.py"),
        180,  # 66 of 76 in its old 60 s, one mutant at a time (the webapp targets run so)
    ),
    Target(
        "reader-limits",
        "analysis/unpickler.py",
        ("gunzip", "_check_expansion", "unzip", "node_budget", "_check_end", "_BoundedFile.*"),
        # The caps at their edges on small built inputs (under a second); test_reader.py re-reads
        # the real files in every test, and test_hostile.py's bombs alone took the budget.
        (
            "tests/analysis/test_reader_limits.py",
            "tests/analysis/test_reader.py::test_a_zip_without_exactly_one_data_pkl_is_refused_by_name",
        ),
        150,
    ),
    Target(
        "reader-expansion",  # the expansion budget's charge, by the converter (was part of reader-limits)
        "analysis/convert.py",
        ("Converter.charge",),
        ("tests/analysis/test_reader_limits.py",),
        60,
    ),
    Target(
        "access",  # the access rule (teams/access.py)
        "webapp/snapshots/teams/access.py",
        ("visible_projects", "visible_uploads", "upload_for_user", "project_for_user"),
        ("tests/webapp/test_access_rules.py", "tests/webapp/test_access.py"),
        100,
    ),
    Target(
        "access-shares",  # a share link's reach (teams/shares.py)
        "webapp/snapshots/teams/shares.py",
        ("upload_for_share_token", "share_revoke", "share_active"),
        ("tests/webapp/test_access_rules.py", "tests/webapp/test_access.py"),
        60,
    ),
    Target(
        "access-tokens",  # an API token's reach (teams/tokens.py)
        "webapp/snapshots/teams/tokens.py",
        ("api_token_user",),
        ("tests/webapp/test_access_rules.py", "tests/webapp/test_access.py"),
        40,
    ),
    Target(
        "upload-limits",
        "webapp/snapshots/intake/uploads.py",
        ("CappedHashingUploadHandler.*",),
        ("tests/webapp/test_uploads.py", "tests/webapp/test_access_rules.py"),
        120,
    ),
    Target(
        "upload-intake",
        "webapp/snapshots/intake/intake.py",
        ("content_length_over_cap", "is_too_large", "check_declared_size"),
        ("tests/webapp/test_uploads.py", "tests/webapp/test_access_rules.py"),
        120,
    ),
    Target(
        "upload-form",
        "webapp/snapshots/intake/forms.py",
        ("split_tags", "UploadForm.*"),
        ("tests/webapp/test_uploads.py", "tests/webapp/test_access_rules.py"),
        60,
    ),
)


@dataclass(frozen=True)
class HandMutant:
    """A mutant written by hand (issue 13's examples): one exact text replacement, which the named
    tests must kill. ``make mutation`` tries each in its own copy of the tree."""

    name: str
    source: str
    old: str
    new: str
    tests: tuple[str, ...]


HAND_MUTANTS = (
    HandMutant(
        "compare-second-snapshot-unchecked",  # the security mutant: compare reads b without the access check
        "webapp/snapshots/pages/views.py",
        "b = _upload_or_404(request, code_b)",
        "b = Upload.objects.get(code=code_b)",
        ("tests/webapp/test_access_rules.py", "tests/webapp/test_access.py", "tests/webapp/test_pages.py"),
    ),
    HandMutant(
        "inline-large-split-boundary",  # _Model.run's inlined should_split: > 1 MiB becomes >= 1 MiB
        "analysis/allocator/cachemodel.py",
        "if rem > split_over[lk] and rs < split_below[lk]:",
        "if rem >= split_over[lk] and rs < split_below[lk]:",
        ("tests/analysis/test_blocks.py", "tests/analysis/test_allocator.py", "tests/analysis/test_config.py"),
    ),
    HandMutant(
        "split-rule-large-pool-boundary",  # AllocatorConfig.split_rule (_Allocator.split calls it): > 1 MiB -> >= 1 MiB
        "analysis/allocator/config.py",
        "return K_SMALL_SIZE, self.max_split_size",
        "return K_SMALL_SIZE - 1, self.max_split_size",
        ("tests/analysis/test_blocks.py", "tests/analysis/test_allocator.py", "tests/analysis/test_config.py"),
    ),
    HandMutant(
        "split-rule-small-pool-boundary",  # AllocatorConfig.split_rule: remainder >= 512 becomes > 512
        "analysis/allocator/config.py",
        "return K_MIN_BLOCK_SIZE - 1, NO_SIZE_LIMIT",
        "return K_MIN_BLOCK_SIZE, NO_SIZE_LIMIT",
        ("tests/analysis/test_size_rules.py", "tests/analysis/test_blocks.py", "tests/analysis/test_config.py"),
    ),
    HandMutant(
        "replay-inline-large-split-boundary",  # _Replayer.run's inlined should_split: > 1 MiB becomes >= 1 MiB
        "analysis/allocator/replayer.py",
        "else (rem > over_l and r < below_l):",
        "else (rem >= over_l and r < below_l):",
        ("tests/analysis/test_blocks.py", "tests/analysis/test_replay.py"),
    ),
    HandMutant(
        "upload-cap-boundary",  # a file of exactly the cap refused
        "webapp/snapshots/intake/uploads.py",
        "if self._received > settings.UPLOAD_MAX_BYTES:",
        "if self._received >= settings.UPLOAD_MAX_BYTES:",
        ("tests/webapp/test_access_rules.py", "tests/webapp/test_uploads.py", "tests/webapp/test_api.py"),
    ),
    HandMutant(
        "token-of-inactive-user",  # an inactive user's API token still works
        "webapp/snapshots/teams/tokens.py",
        "if token is None or not token.user.is_active:",
        "if token is None:",
        ("tests/webapp/test_access_rules.py", "tests/webapp/test_api.py"),
    ),
    HandMutant(
        "revoked-share-link",  # a revoked share link still works
        "webapp/snapshots/teams/shares.py",
        "ShareLink.objects.filter(token_hash=token_hash(token), revoked_at__isnull=True)",
        "ShareLink.objects.filter(token_hash=token_hash(token))",
        ("tests/webapp/test_access_rules.py", "tests/webapp/test_api.py", "tests/webapp/test_pages.py"),
    ),
)


def access_mutants() -> tuple[HandMutant, ...]:
    """``scripts/access_mutants.py``'s mutants of the access checks and upload limits, each against
    that script's tests, as hand mutants of this run (one not already above)."""
    spec = importlib.util.spec_from_file_location("access_mutants", ROOT / "scripts" / "access_mutants.py")
    assert spec is not None
    assert spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    known = {(m.source, m.old.strip(), m.new.strip()) for m in HAND_MUTANTS}
    return tuple(
        HandMutant(f"access-{i}", path, old, new, tuple(mod.TESTS))
        for i, (path, old, new) in enumerate(mod.M)
        if (path, old.strip(), new.strip()) not in known
    )


def run_hand_mutant(m: HandMutant, rev: str | None) -> dict[str, object]:
    dest = Path(tempfile.mkdtemp(prefix=f"oomscope-hand-{m.name}-"))
    try:
        copy_tree(dest, rev)
        path = dest / m.source
        text = path.read_text()
        if text.count(m.old) != 1:
            return {"name": m.name, "status": "not applicable", "detail": f"{m.old!r} not found once in {m.source}"}
        path.write_text(text.replace(m.old, m.new))
        tests = [t for t in m.tests if (dest / t.split("::")[0]).exists()]  # a file or a test id
        if not tests:  # an empty selection would be the whole suite
            return {"name": m.name, "status": "no tests", "detail": f"none of {', '.join(m.tests)} exists"}
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        argv = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
        done = subprocess.run(argv, cwd=dest, capture_output=True, text=True, env=env, timeout=900)  # noqa: S603
        failed = [line for line in done.stdout.splitlines() if line.startswith("FAILED")]
        return {
            "name": m.name,
            "source": m.source,
            "mutation": f"{m.old}  ->  {m.new}",
            "tests": tests,
            "status": "killed"
            if done.returncode == 1
            else ("survived" if done.returncode == 0 else f"rc {done.returncode}"),
            "killed_by": failed[:3],
        }
    finally:
        shutil.rmtree(dest, ignore_errors=True)


def module_of(source: str) -> str:
    return source.removesuffix(".py").replace("/", ".")


def mutant_glob(target: Target, function: str) -> str:
    """mutmut's mutant names: ``pkg.mod.x_func__mutmut_N``, ``pkg.mod.xǁClassǁmethod__mutmut_N``."""
    mod = module_of(target.source)
    if function == "*":
        return f"{mod}.*"
    if "." in function:
        cls, meth = function.split(".", 1)
        return f"{mod}.xǁ{cls}ǁ{meth}__mutmut_*"
    return f"{mod}.x_{function}__mutmut_*"


def copy_tree(dest: Path, rev: str | None) -> None:
    """The working tree as it is, or (``rev``) the tree of one commit, e.g. the one before new tests."""
    if rev and rev.endswith(".tar"):  # a `git archive` made earlier (a machine without the git history)
        shutil.unpack_archive(rev, dest, "tar")
        return
    if rev:
        archive = subprocess.run(["git", "archive", rev], cwd=ROOT, capture_output=True, check=True).stdout  # noqa: S603, S607
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)  # noqa: S603, S607
        return
    try:
        files = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],  # noqa: S607 - git from PATH
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout.split(b"\0")
    except (OSError, subprocess.CalledProcessError):  # a plain copy of the tree: all but the bulky folders
        skip = shutil.ignore_patterns(".venv", "var", ".whl", "mutants", "__pycache__", ".git")
        shutil.copytree(ROOT, dest, ignore=skip, dirs_exist_ok=True)
        return
    for raw in files:
        if not raw:
            continue
        rel = Path(os.fsdecode(raw))
        src = ROOT / rel
        if not src.is_file() or rel.parts[0] in (".venv", "var"):
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / rel)


def restrict_lines(dest: Path, target: Target) -> None:
    """Mark every line of each ``rule_lines`` function that does not match its regex ``no mutate``."""
    if not target.rule_lines:
        return
    path = dest / target.source
    lines = path.read_text().splitlines()
    tree = ast.parse("\n".join(lines))
    spans: dict[str, tuple[int, int]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    spans[f"{node.name}.{item.name}"] = (item.body[0].lineno, item.end_lineno or item.lineno)
        elif isinstance(node, ast.FunctionDef):
            spans.setdefault(node.name, (node.body[0].lineno, node.end_lineno or node.lineno))
    for function, pattern in target.rule_lines:
        lo, hi = spans[function]
        rule = re.compile(pattern)
        for i in range(lo - 1, hi):
            text = lines[i]
            if text.strip() and not rule.search(text) and not text.rstrip().endswith("\\"):
                lines[i] = text + "  # pragma: no mutate"
    path.write_text("\n".join(lines) + "\n")


# mutmut runs each mutant in a child forked from the process that ran the tests once already (the
# "stats" run, which also records which tests reach which function). Test modules @cache results
# (a report, a replay): in the stats run only the first test to ask would reach the code and be
# recorded, and in a child the cached result of the unmutated code would answer for the mutant.
# This plugin, written into the copy, empties every functools cache of the test modules before
# each test of the stats run and at the start of each mutant's run.
FRESH_CACHES = """\"\"\"Written by scripts/mutation.py: no cached result outlives a mutant (see there).\"\"\"
import os
import sys


def _clear():
    for name, module in list(sys.modules.items()):
        if not (name.startswith("tests") or "/tests/" in (getattr(module, "__file__", None) or "")):
            continue
        for value in list(vars(module).values()):
            if callable(getattr(value, "cache_clear", None)):
                value.cache_clear()


def pytest_sessionstart(session):
    _clear()


def pytest_runtest_setup(item):
    if os.environ.get("MUTANT_UNDER_TEST") == "stats":
        _clear()
"""


def configure(dest: Path, target: Target, tests: list[str]) -> None:
    pyproject = dest / "pyproject.toml"
    text = pyproject.read_text()
    text = re.sub(r'(?m)^pythonpath = \["\."\]\n', "", text)
    text += (
        "\n[tool.mutmut]\n"
        'source_paths = ["analysis/", "webapp/"]\n'
        'also_copy = ["templates/", "static/"]\n'
        f"only_mutate = [{json.dumps(target.source)}]\n"
        f"pytest_add_cli_args_test_selection = {json.dumps(tests)}\n"
        'pytest_add_cli_args = ["-o", "django_find_project=false", "-p", "no:cacheprovider", "-q",'
        ' "-p", "tests._mutation_fresh_caches"]\n'
        "use_git_change_detection = false\n"
    )
    if target.timeout_multiplier is not None:
        text += f"timeout_multiplier = {target.timeout_multiplier}\n"
    pyproject.write_text(text)
    (dest / "tests" / "_mutation_fresh_caches.py").write_text(FRESH_CACHES)


def results(dest: Path, target: Target, globs: list[str]) -> dict[str, int]:
    meta = dest / "mutants" / (target.source + ".meta")
    if not meta.exists():
        return {}
    codes = json.loads(meta.read_text())["exit_code_by_key"]
    return {k: v for k, v in codes.items() if any(fnmatch.fnmatchcase(k, g) for g in globs)}


def show(dest: Path, mutmut: str, name: str) -> str:
    argv = [mutmut, "show", name]
    done = subprocess.run(argv, cwd=dest, capture_output=True, text=True, timeout=60)  # noqa: S603 - fixed argv
    return "\n".join(line for line in done.stdout.splitlines() if not line.startswith(("#", "---", "+++")))


def _stop(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def run_target(
    target: Target,
    *,
    budget: int | None,
    jobs: int,
    keep: bool,
    rev: str | None,
    label: str,
    only: tuple[str, ...] = (),
) -> dict[str, object]:
    globs = [mutant_glob(target, f) for f in target.functions]
    if only:  # some of the target's mutants again (e.g. a run's survivors, against tests added since)
        globs = [name for name in only if any(fnmatch.fnmatchcase(name, g) for g in globs)]
        if not globs:
            raise SystemExit(f"{target.name}: none of --only names one of its mutants")
    mutmut = str(Path(sys.executable).parent / "mutmut")
    limit = budget or target.budget_s
    if target.source.startswith("webapp/"):
        # One mutant at a time for the Django targets: with --jobs 2, equivalent mutants (the same
        # SQL, to the character) counted as killed. Likely cause: mutmut forks every child from its
        # stats process, whose settings named the test database after that process's pid
        # (var/test-<pid>.sqlite3), so two children share one SQLite file.
        jobs = 1
    dest = Path(tempfile.mkdtemp(prefix=f"oomscope-mutation-{target.name}-"))
    started = time.monotonic()
    timed_out = False
    try:
        copy_tree(dest, rev)
        tests = [t for t in target.tests if (dest / t.split("::")[0]).exists()]  # a file or a test id
        if not tests:  # an empty selection would be the whole suite
            raise SystemExit(f"{target.name}: none of {', '.join(target.tests)} exists")
        configure(dest, target, tests)
        restrict_lines(dest, target)
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
        env.pop("PYTHONPATH", None)
        log = (OUT / f"{label}-{target.name}.log").open("w")
        proc = subprocess.Popen(  # noqa: S603 - fixed argv, mutant globs built here
            [mutmut, "run", "--max-children", str(jobs), *globs],
            cwd=dest,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        try:
            proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            timed_out = True
            _stop(proc)
        except BaseException:  # Ctrl-C or SIGTERM: mutmut runs in its own session, stop it too
            _stop(proc)
            raise
        log.close()
        codes = results(dest, target, globs)
        killed = sorted(k for k, v in codes.items() if v in KILLED)
        timeout = sorted(k for k, v in codes.items() if v in TIMEOUT)
        survived = sorted(k for k, v in codes.items() if v in SURVIVED)
        no_tests = sorted(k for k, v in codes.items() if v in NO_TESTS)
        other = sorted(
            k for k, v in codes.items() if v is not None and k not in {*killed, *timeout, *survived, *no_tests}
        )
        tried = len(killed) + len(timeout) + len(survived) + len(no_tests) + len(other)
        out: dict[str, object] = {
            "target": target.name,
            "source": target.source,
            "functions": list(target.functions),
            "rule_lines": dict(target.rule_lines),
            "tests": tests,
            "mutants": len(codes),
            "tried": tried,
            "killed": len(killed),
            "timeout": len(timeout),
            "survived": len(survived),
            "no_tests": len(no_tests),
            "other": len(other),
            "kill_rate": round((len(killed) + len(timeout)) / tried, 4) if tried else None,
            "seconds": round(time.monotonic() - started),
            "budget_s": limit,
            "stopped_at_budget": timed_out,
            "survivors": {name: show(dest, mutmut, name) for name in [*survived, *no_tests, *other]},
        }
        return out
    finally:
        if keep:
            print(f"  kept {dest}")
        else:
            shutil.rmtree(dest, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("targets", nargs="*", help="target names (default: all)")
    parser.add_argument("--budget", type=int, help="seconds per target (default: the target's own)")
    parser.add_argument("--jobs", type=int, default=2, help="mutants tested at once (default 2)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary copies (for `mutmut browse`)")
    parser.add_argument("--list", action="store_true", help="list the targets and exit")
    parser.add_argument("--rev", help="test the tree of this commit (or of this `git archive` .tar) instead")
    parser.add_argument("--label", default="latest", help="name of the summary file under var/mutation/")
    parser.add_argument(
        "--only", nargs="+", default=(), metavar="MUTANT", help="only these mutants (full names) of the targets"
    )
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops mutmut too
    by_name = {t.name: t for t in TARGETS}
    if args.list:
        for t in TARGETS:
            print(f"{t.name:14} {t.source:32} {t.budget_s:4d}s  {', '.join(t.tests)}")
        return 0
    unknown = [n for n in args.targets if n not in by_name and n != "hand"]
    if unknown:
        parser.error(f"unknown target(s) {', '.join(unknown)}; --list names them")
    started = time.monotonic()
    names = [n for n in args.targets if n != "hand"]
    chosen = [by_name[n] for n in names] if args.targets else list(TARGETS)
    OUT.mkdir(parents=True, exist_ok=True)
    summary: list[dict[str, object]] = []
    if not args.targets or "hand" in args.targets:
        for m in HAND_MUTANTS + access_mutants():
            res = run_hand_mutant(m, args.rev)
            print(f"hand mutant {m.name}: {res['status']} {' '.join(res.get('killed_by', []))}", flush=True)  # type: ignore[arg-type]
            summary.append({"target": "hand", **res})
    for target in chosen:
        print(f"{target.name}: {target.source}", flush=True)
        res = run_target(
            target,
            budget=args.budget,
            jobs=args.jobs,
            keep=args.keep,
            rev=args.rev,
            label=args.label,
            only=tuple(args.only),
        )
        summary.append(res)
        rate = res["kill_rate"]
        assert rate is None or isinstance(rate, float)  # run_target's round(...) or None
        print(f"  tests: {', '.join(res['tests'])}")  # type: ignore[arg-type]
        print(
            f"  {res['killed']} killed + {res['timeout']} timeout / {res['tried']} tried of {res['mutants']}"
            f" ({'n/a' if rate is None else f'{100 * float(rate):.1f} %'}), {res['survived']} survived,"
            f" {res['no_tests']} without tests, {res['seconds']} s"
            + (" (stopped at the budget)" if res["stopped_at_budget"] else ""),
            flush=True,
        )
        for name, diff in dict(res["survivors"]).items():  # type: ignore[call-overload]
            print(f"    survived: {name}\n      " + "\n      ".join(diff.splitlines()[-6:]))
    print(f"total {round(time.monotonic() - started)} s")
    (OUT / f"{args.label}.json").write_text(json.dumps(summary, indent=1))
    print(f"written {OUT / (args.label + '.json')}")
    # A hand mutant is a test's promise: one not killed (survived, not applicable) fails the run.
    missed = [r["name"] for r in summary if r["target"] == "hand" and r["status"] != "killed"]
    if missed:
        print(f"hand mutants not killed: {', '.join(map(str, missed))}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
