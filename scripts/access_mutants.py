"""Hand-written one-line mutants of the access checks and upload limits, each run against their tests.

``.venv/bin/python scripts/access_mutants.py [N ...]`` (``make mutation`` runs it after mutmut's targets):
applies each mutant (or only mutants N), runs the access, role, token, share-link and upload tests
with ``-x``, restores the file, and prints killed / SURVIVED per mutant, or STALE for one whose
source text is gone (the run goes on; ``tests/test_access_mutants.py`` catches that at once). Exit 1
unless every mutant is killed. Mutant 0 is issue 13's security mutant (compare's second snapshot
looked up without the access check). About 15 minutes on the 2-core box.
"""

# ruff: noqa: E501 - each mutant is the exact source text it replaces
from __future__ import annotations

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
TESTS = [
    "tests/webapp/test_access.py",
    "tests/webapp/test_roles.py",
    "tests/webapp/test_tokens.py",
    "tests/webapp/test_share_links.py",
    "tests/webapp/test_uploads.py",
]
M = [
    (
        "webapp/snapshots/pages/views.py",
        "    b = _upload_or_404(request, code_b)",
        "    b = Upload.objects.get(code=code_b)",
    ),
    (
        "webapp/snapshots/pages/views.py",
        "    a = _upload_or_404(request, code_a)",
        "    a = Upload.objects.get(code=code_a)",
    ),
    (
        "webapp/snapshots/pages/views.py",
        "    project = access.project_for_user(request.user, slug)\n    if project is None:\n        raise Http404\n    uploads",
        "    from webapp.snapshots.models import Project\n    project = Project.objects.filter(slug=slug).first()\n    if project is None:\n        raise Http404\n    uploads",
    ),
    (
        "webapp/snapshots/pages/views.py",
        "    upload = access.upload_for_user(request.user, code)\n    if upload is None:\n        raise Http404",
        "    upload = Upload.objects.filter(code=code).first()\n    if upload is None:\n        raise Http404",
    ),
    (
        "webapp/snapshots/api/uploads.py",
        "    upload = access.upload_for_user(request.user, code)\n    # A token limited",
        "    upload = Upload.objects.filter(code=code).first()\n    # A token limited",
    ),
    (
        "webapp/snapshots/api/projects.py",
        "    project = access.project_for_user(request.user, slug)\n    if project is not None and not access.token_allows",
        "    project = Project.objects.filter(slug=slug).first()\n    if project is not None and not access.token_allows",
    ),
    (
        "webapp/snapshots/intake/accept.py",
        "    if slug:\n        project = project_for_user(user, slug)",
        "    if slug:\n        project = Project.objects.filter(slug=slug).first()",
    ),
    (
        "webapp/snapshots/teams/access.py",
        "return Upload.objects.filter(project__team__memberships__user=user).select_related(",
        "return Upload.objects.all().select_related(",
    ),
    (
        "webapp/snapshots/teams/tokens.py",
        "ApiToken.objects.filter(token_hash=token_hash(raw), revoked_at__isnull=True)",
        "ApiToken.objects.filter(token_hash=token_hash(raw))",
    ),
    (
        "webapp/snapshots/teams/tokens.py",
        "Q(expires_at__gt=timezone.now())",
        "Q(expires_at__lt=timezone.now()) | Q(expires_at__gt=timezone.now())",
    ),
    ("webapp/snapshots/teams/tokens.py", "Q(expires_at__gt=timezone.now())", "Q(expires_at__gte=timezone.now())"),
    ("webapp/snapshots/teams/tokens.py", "if token is None or not token.user.is_active:", "if token is None:"),
    (
        "webapp/snapshots/teams/shares.py",
        "ShareLink.objects.filter(token_hash=token_hash(token), revoked_at__isnull=True)",
        "ShareLink.objects.filter(token_hash=token_hash(token))",
    ),
    (
        "webapp/snapshots/teams/shares.py",
        'update(use_count=F("use_count") + 1,',
        'update(use_count=F("use_count") + 2,',
    ),
    ("webapp/snapshots/teams/shares.py", "    if count_use:\n", "    if True:\n"),
    (
        "webapp/snapshots/teams/access.py",
        'Membership.Role.VIEWER: frozenset({"read"}),',
        'Membership.Role.VIEWER: frozenset({"read", "write"}),',
    ),
    ("webapp/snapshots/intake/accept.py", 'if not can(user, project.team, "write"):', "if False:"),
    (
        "webapp/snapshots/api/uploads.py",
        'if not access.can(request.user, upload.project.team, "write"):',
        "if False:",
    ),
    (
        "webapp/snapshots/pages/views.py",
        '"#share")\n    if not access.can(request.user, upload_row.project.team, "write"):',
        '"#share")\n    if False:',
    ),
    (
        "webapp/snapshots/pages/views.py",
        '"#basis")\n    if not access.can(request.user, upload_row.project.team, "write"):',
        '"#basis")\n    if False:',
    ),
    (
        "webapp/snapshots/pages/views.py",
        'for p in access.writable_projects(request.user).order_by("team__name", "name")\n    ]',
        'for p in access.visible_projects(request.user).order_by("team__name", "name")\n    ]',
    ),
    (
        "webapp/snapshots/teams/access.py",
        "team__memberships__user=user, team__memberships__role__in=roles",
        "team__memberships__user=user",
    ),
    (
        "webapp/snapshots/intake/uploads.py",
        "if self._received > settings.UPLOAD_MAX_BYTES:",
        "if self._received >= settings.UPLOAD_MAX_BYTES:",
    ),
    (
        "webapp/snapshots/intake/intake.py",
        "return length > settings.UPLOAD_MAX_BYTES + MULTIPART_OVERHEAD",
        "return length >= settings.UPLOAD_MAX_BYTES + MULTIPART_OVERHEAD",
    ),
    (
        "webapp/snapshots/intake/intake.py",
        "if uploaded.size is not None and uploaded.size > settings.UPLOAD_MAX_BYTES:",
        "if uploaded.size is not None and uploaded.size >= settings.UPLOAD_MAX_BYTES:",
    ),
    ("webapp/snapshots/intake/forms.py", "RUN_MAX_CHARS = 200", "RUN_MAX_CHARS = 201"),
    ("webapp/snapshots/intake/forms.py", "NOTE_MAX_CHARS = 5000", "NOTE_MAX_CHARS = 4999"),
    ("webapp/snapshots/intake/forms.py", "TAGS_MAX_CHARS = 500", "TAGS_MAX_CHARS = 501"),
    (
        "webapp/snapshots/intake/store.py",
        "tags=[t for t in (tags or []) if t][:20],",
        "tags=[t for t in (tags or []) if t][:21],",
    ),
    ("webapp/snapshots/intake/forms.py", "t.strip()[:50]", "t.strip()[:51]"),
]


def stale() -> list[int]:
    """The mutants whose source text is no longer in its file exactly once (the code moved on)."""
    return [i for i, (path, old, _new) in enumerate(M) if (ROOT / path).read_text().count(old) != 1]


def run_one(i: int) -> tuple[bool, str]:
    """Mutant ``i`` applied, the tests run against it with ``-x``, the file restored: (killed, first failure)."""
    path, old, new = M[i]
    f = ROOT / path
    text = f.read_text()
    f.write_text(text.replace(old, new))
    try:
        r = subprocess.run(  # noqa: S603 - fixed argv
            [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *TESTS],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
    finally:
        f.write_text(text)
    fail = [line for line in r.stdout.splitlines() if line.startswith("FAILED")]
    return r.returncode != 0, fail[0] if fail else ""


def main(argv: list[str]) -> int:
    """Every mutant (or mutants N ...); exit 1 when one survives or no longer applies."""
    only = {int(a) for a in argv}
    chosen = [i for i in range(len(M)) if not only or i in only]
    gone = set(stale())
    killed = 0
    for i in chosen:
        path, _old, new = M[i]
        if i in gone:
            print(f"{i:2d} STALE    {path}: its source text is not there exactly once; update the mutant", flush=True)
            continue
        dead, first = run_one(i)
        killed += dead
        print(f"{i:2d} {'killed' if dead else 'SURVIVED':8s} {path}: {new.strip()[:70]!r}  <- {first}", flush=True)
    print(f"killed {killed}/{len(chosen)}")
    return 0 if killed == len(chosen) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
