"""Issue 17, item 5: one upload's walk through our modules, checked each once (docs/architecture.md,
"The upload's walk").

Before, one API upload entered 10 of our modules 29 times (87 visits): the quota and the cost were
checked twice, the cost estimated three times, the project resolved twice, and the view and the
intake alternated. Now the view hands off to the intake once (every check that needs no project)
and to the service once (the project, the team's queue and quota, the row); each module is entered
in one hand-off, each of its functions once. A second check, a re-resolved project or an intake
step moved back into the view fails here.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

from tests.webapp.helpers import GPT_OOM, bearer
from tests.webapp.walk import Handoff, Walk, walk
from webapp.snapshots.api import uploads
from webapp.snapshots.models import Upload
from webapp.snapshots.pages import views

pytestmark = pytest.mark.django_db

M = "webapp.snapshots."

# The API upload's hand-offs, in order: (caller, callee, the callee's functions entered).
API_WALK = [
    ("api.uploads", "intake.intake", ("admit",)),
    ("intake.intake", "intake.disk", ("check_room",)),  # the disk guard, on the declared length
    ("intake.intake", "intake.ratelimits", ("check_upload_rate",)),  # per token and per user, before the body
    ("intake.intake", "intake.runarchive", ("is_archive",)),  # a run's ranks in one tar or zip?
    ("intake.intake", "intake.uploads", ("sniff",)),  # else the head must be a snapshot
    ("intake.forms", "usertext", ("clean_line", "clean_line", "clean_text")),  # the run's name, its tags, the note
    ("intake.intake", "intake.forms", ("upload_fields", "run_meta")),  # the validated text fields
    ("intake.intake", "intake.cost", ("estimate_cost", "check")),  # the cost from the bytes and their shape, once
    ("api.uploads", "intake.accept", ("upload_admit",)),  # the project, then the row
    # The project named, in the token's reach, writable; a finished run's name is a team admin's.
    ("intake.accept", "teams.access", ("project_for_user", "token_allows", "can", "can")),
    ("intake.accept", "intake.quota", ("check_team_queued_cost", "check_team_quota")),  # each once
    ("intake.accept", "intake.store", ("upload_create",)),
    ("intake.store", "intake.blobs", ("store_blob",)),
    ("intake.store", "runs.followups", ("link",)),  # is it a follow-up of an earlier OOM? (issue 33)
    ("intake.store", "runs.runs", ("run_attach",)),
    ("api.uploads", "pages.payloads", ("upload_api_dict",)),  # the answer
    ("pages.payloads", "teams.shares", ("share_active",)),
]
# Entered more than once on purpose: a text field's cleaning (one per field) and a right asked of the
# access rule (``can``: write for the project, manage for a finished run's name). Every other function once.
PER_ITEM = {(M + "usertext", "clean_line"), (M + "teams.access", "can")}


def _short(walked: Walk) -> list[tuple[str, str, tuple[str, ...]]]:
    return [(h.caller.removeprefix(M), h.callee.removeprefix(M), h.functions) for h in walked.handoffs()]


def _api_upload(client: Any, token: str, capture: Any) -> tuple[Walk, Any]:
    client.get("/api/v1/projects", **bearer(token))  # the URLconf and the API's modules imported
    with GPT_OOM.open("rb") as fh, capture():
        return walk(
            lambda: client.post("/api/v1/snapshots", {"file": fh, "project": "alpha", "run": "r1"}, **bearer(token)),
            uploads.snapshots,
        )


def test_one_api_upload_enters_each_module_once_in_order(
    client: Any, alice_token: str, django_capture_on_commit_callbacks: Any
) -> None:
    walked, answer = _api_upload(client, alice_token, django_capture_on_commit_callbacks)
    handoffs = walked.handoffs()
    print(  # the figures of docs/architecture.md (pytest -s)
        f"\nvisits {len(walked.visits)} to {len(walked.modules)} modules ({walked.returns} returns); "
        f"{len(walked.entries)} entries; {len(handoffs)} hand-offs into {len({h.callee for h in handoffs})} modules"
    )
    assert answer.status_code == 202, answer.content
    assert Upload.objects.get(code=json.loads(answer.content)["id"]).run == "r1"
    assert _short(walked) == API_WALK, json.dumps(_short(walked), indent=1)
    callees = [h.callee for h in walked.handoffs()]
    assert len(callees) == len(set(callees)), "a module is entered in two hand-offs"
    entered = Counter((callee, name) for _caller, callee, name in walked.entries if (callee, name) not in PER_ITEM)
    assert max(entered.values()) == 1, [k for k, n in entered.items() if n > 1]  # every function once


def test_the_page_upload_runs_the_same_checks_once_in_the_same_order(
    alice_client: Any, alpha: Any, django_capture_on_commit_callbacks: Any
) -> None:
    alice_client.get("/upload/")
    with GPT_OOM.open("rb") as fh, django_capture_on_commit_callbacks():
        walked, answer = walk(lambda: alice_client.post("/upload/", {"file": fh, "project": "alpha"}), views.upload)
    assert answer.status_code == 302, answer.content
    # The declared size and the disk before the CSRF check reads the body, then the form's project
    # choices; from there the API's walk (the page's form is built in the intake: its __init__).
    assert _short(walked) == [
        ("pages.views", "intake.intake", ("check_head",)),
        ("intake.intake", "intake.disk", ("check_room",)),
        ("pages.views", "teams.access", ("writable_projects",)),
        ("pages.views", "intake.intake", ("admit",)),
        *API_WALK[2:5],
        ("intake.intake", "intake.forms", ("__init__", "upload_fields", "run_meta")),
        API_WALK[5],
        API_WALK[7],
        ("pages.views", "intake.accept", ("upload_admit",)),
        # No run name: the finished-run check asks no right.
        ("intake.accept", "teams.access", ("project_for_user", "token_allows", "can")),
        *API_WALK[10:15],
    ], json.dumps(_short(walked), indent=1)
    entered = Counter((callee, name) for _caller, callee, name in walked.entries if (callee, name) not in PER_ITEM)
    assert max(entered.values()) == 1, [k for k, n in entered.items() if n > 1]  # every function once


def test_handoffs_merge_only_consecutive_entries_of_one_caller() -> None:
    walked = Walk(
        visits=[],
        entries=[("a", "b", "f"), ("b", "c", "g"), ("a", "b", "h"), ("a", "c", "i"), ("a", "b", "j")],
    )
    assert walked.handoffs() == [
        Handoff("a", "b", ("f", "h")),
        Handoff("b", "c", ("g",)),
        Handoff("a", "c", ("i",)),
        Handoff("a", "b", ("j",)),
    ]


def _key_lookups(queries: list[dict[str, Any]]) -> list[str]:
    """The SELECTs that look a row up by its Idempotency-Key."""
    return [
        q["sql"]
        for q in queries
        if q["sql"].lstrip().upper().startswith("SELECT") and '"idempotency_key"' in q["sql"].split(" WHERE ", 1)[-1]
    ]


def test_a_keyed_upload_queries_its_key_once(
    client: Any, alice_token: str, django_capture_on_commit_callbacks: Any
) -> None:
    """The intake looks the key up (``Admission.earlier``); the store does not again (issue 31: it did,
    twice per upload): the row's unique constraint answers there."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    client.get("/api/v1/projects", **bearer(alice_token))
    posted = []
    for _ in range(2):
        with GPT_OOM.open("rb") as fh, django_capture_on_commit_callbacks(), CaptureQueriesContext(connection) as seen:
            answer = client.post(
                "/api/v1/snapshots",
                {"file": fh, "project": "alpha"},
                headers={"Idempotency-Key": "job-31"},
                **bearer(alice_token),
            )
        assert answer.status_code == (200 if posted else 202), answer.content  # the repeat: 200, the same
        posted.append((json.loads(answer.content)["id"], _key_lookups(seen.captured_queries)))
    (first, first_lookups), (again, again_lookups) = posted
    assert len(first_lookups) == 1 and len(again_lookups) == 1  # the repeat: found by the intake, once
    assert again == first and Upload.objects.count() == 1


def test_a_key_used_before_that_reaches_the_store_is_the_same_upload(alice: Any, alpha: Any) -> None:
    """A repeat the intake did not see (an archive's rank, a racing request) is answered by the row's
    unique constraint: the earlier upload, or ``IdempotencyConflict`` for other bytes."""
    import hashlib

    from django.core.files.uploadedfile import SimpleUploadedFile

    from webapp.snapshots.errors import IdempotencyConflict
    from webapp.snapshots.intake import store

    data = GPT_OOM.read_bytes()

    def create(sha256: str) -> Upload:
        uploaded = SimpleUploadedFile("a.pickle.gz", data)
        return store.upload_create(
            user=alice, project=alpha, uploaded=uploaded, sha256=sha256, fmt="pickle.gz", idempotency_key="k-1"
        )

    sha256 = hashlib.sha256(data).hexdigest()
    first = create(sha256)
    again = create(sha256)
    assert again.pk == first.pk and again.replayed and not getattr(first, "replayed", False)
    with pytest.raises(IdempotencyConflict):
        create("0" * 64)
    assert Upload.objects.count() == 1
