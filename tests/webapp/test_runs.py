"""Runs through the API and the pages: metadata, two ranks as one run, baselines, regressions, the
webhook delivered to a real HTTP receiver on loopback, the gate's endpoint, retention.

The tasks run in this process as the worker would run them (``analyse_rank`` per rank, then the
summary); ``test_runs_chord.py`` runs the real chord on two worker processes. The two-rank run is
the real DDP job of ``tests/fixtures/runs`` (rank 0 died of an OOM, rank 1's all-reduce then lost
its peer); the one-process runs compared with baselines are two real H200 captures of one GPT
workload (``tests/analysis/test_runs.py`` says which): DIED ran out of memory at step 3, LIVED ran.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone
from django.utils.html import escape

from tests.webapp.helpers import FIXTURES, bearer
from webapp.snapshots import publish
from webapp.snapshots.models import Run, RunPolicy, Upload, WebhookDelivery
from webapp.snapshots.runs import runs
from webapp.snapshots.worker import runtasks
from webapp.snapshots.worker.tasks import analyse_upload

pytestmark = pytest.mark.django_db

CAPTURES = FIXTURES / "captures"
DIED = CAPTURES / "gpt_autocast_c75_default.pickle.gz"
LIVED = CAPTURES / "gpt_autocast_c75_expandable.pickle.gz"
RUNS = FIXTURES / "runs"
RANK_FILES = [RUNS / "ddp_gloo_rank0.pickle.gz", RUNS / "ddp_gloo_rank1.pickle.gz"]


def sidecar(rank: int) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((RUNS / f"ddp_gloo_rank{rank}.json").read_text())
    return data


def peak(path: Path) -> int:
    truth = json.loads(path.with_name(path.name.replace(".pickle.gz", ".truth.json")).read_text())
    value: int = truth["memory_stats"]["reserved_bytes.all.peak"]
    return value


def post(client: Any, token: str, path: Path, **fields: Any) -> Any:
    with path.open("rb") as fh:
        return client.post("/api/v1/snapshots", {"file": fh, **fields}, **bearer(token))


def two_rank_run(client: Any, token: str, capture: Any, name: str = "ddp-16", **meta: Any) -> Run:
    """Post rank 0 (died) and rank 1 (its collective failed) of the real DDP run; return the Run."""
    common = {"run": name, "world_size": 2, "commit": "a1b2c3d4", "branch": "main", "host": "gpu-7", **meta}
    with capture() as first:
        r0 = post(
            client,
            token,
            RANK_FILES[0],
            rank=0,
            torch_version="2.11.0",
            job_id="slurm-991",
            oom_message=sidecar(0)["oom_message"],
            **common,
        )
    assert r0.status_code == 202, r0.content
    assert first == [], "a rank of an incomplete run is not published alone"
    with capture() as second:
        r1 = post(client, token, RANK_FILES[1], rank=1, error=sidecar(1)["error"], **common)
    assert r1.status_code == 202, r1.content
    assert len(second) == 1, "the last rank publishes the run's chord, once"
    return Run.objects.get(name=name)


def analyse_as_the_chord_would(run: Run) -> str:
    for upload in run.uploads.order_by("rank"):
        assert runtasks.analyse_rank(upload.id) == upload.id
    return runtasks.summarise_run(run.id)


def test_two_ranks_become_one_run_with_its_metadata(
    client: Any, alice_token: str, django_capture_on_commit_callbacks: Any
) -> None:
    run = two_rank_run(client, alice_token, django_capture_on_commit_callbacks)
    assert (run.commit, run.branch, run.host, run.torch_version, run.job_id, run.world_size) == (
        "a1b2c3d4",
        "main",
        "gpu-7",
        "2.11.0",
        "slurm-991",
        2,
    )
    assert run.status == Run.Status.ANALYSING
    ranks = {u.rank: u for u in run.uploads.all()}
    assert set(ranks) == {0, 1} and all(u.status == Upload.Status.QUEUED for u in ranks.values())
    assert ranks[1].meta["error"] == sidecar(1)["error"] and ranks[0].meta["world_size"] == 2
    # The chord that was published: one analyse_rank per rank, then the summary.
    sig = publish.run_chord(run.id, [ranks[0].id, ranks[1].id])
    assert [t.task for t in sig.tasks] == ["snapshots.analyse_rank"] * 2
    assert sig.body.task == "snapshots.summarise_run" and sig.body.args == (run.id,)

    assert analyse_as_the_chord_would(run) == "done"
    body = client.get(f"/api/v1/runs/{run.code}", **bearer(alice_token)).json()
    head = body["summary"]["run"]
    assert body["status"] == "done"
    assert head["first_oom_rank"] == 0 and head["peer_failed_ranks"] == [1]
    peaks = [sidecar(r)["memory_stats"]["reserved_bytes.all.peak"] for r in (0, 1)]
    assert head["imbalance"]["peak_reserved"] == round(max(peaks) / (sum(peaks) / 2), 4) == 1.4075
    assert [r["peak_reserved_bytes"] for r in body["summary"]["ranks"]] == peaks
    assert [u["rank"] for u in body["uploads"]] == [0, 1]
    # The per-rank reports keep working on their own.
    report = client.get(f"/api/v1/snapshots/{ranks[0].code}/report", **bearer(alice_token)).json()
    assert report["devices"][0]["summary"]["peak_reserved_bytes"] == peaks[0]
    assert report["devices"][0]["oom"]["limit_bytes"] == 2 * 2**30  # from rank 0's OOM message


def test_the_run_page_says_which_rank_died_first_and_which_failed_for_a_peer(
    client: Any, alice: Any, alice_token: str, django_capture_on_commit_callbacks: Any
) -> None:
    run = two_rank_run(client, alice_token, django_capture_on_commit_callbacks)
    analyse_as_the_chord_would(run)
    client.force_login(alice)
    page = client.get(f"/run/{run.code}/").content.decode()
    assert "Rank 0 ran out of memory first" in page
    reason = Run.objects.get(pk=run.pk).summary["run"]["first_oom_reason"]
    assert reason and escape(reason) in page  # rank 0's own decision headline
    assert "Rank 1 failed because a peer died" in page
    assert "Connection closed by peer" in page
    assert "tmp/d.py:31 &lt;module&gt;" in page  # the stack that differs most between the ranks
    # Each rank's own report names its run and links to it.
    rank0 = run.uploads.get(rank=0)
    assert f'href="/run/{run.code}/"' in client.get(f"/s/{rank0.code}/").content.decode()


def test_a_rank_above_the_world_size_is_refused(client: Any, alice_token: str) -> None:
    response = post(client, alice_token, DIED, run="r", rank=2, world_size=2)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "upload:invalid"
    assert "rank" in response.json()["error"]["message"]
    assert not Upload.objects.exists() and not Run.objects.exists()


def test_an_incomplete_run_is_analysed_when_asked(
    client: Any, alice_token: str, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks():
        post(client, alice_token, DIED, run="short", rank=0, world_size=4)
    run = Run.objects.get(name="short")
    assert run.status == Run.Status.COLLECTING
    with django_capture_on_commit_callbacks() as published:
        response = client.post(f"/api/v1/runs/{run.code}/analyse", **bearer(alice_token))
    assert response.status_code == 202 and len(published) == 1
    assert analyse_as_the_chord_would(run) == "done"
    head = Run.objects.get(pk=run.pk).summary["run"]
    assert head["missing_ranks"] == [1, 2, 3] and head["first_oom_rank"] == 0


def single(client: Any, token: str, path: Path, capture: Any, name: str, branch: str, tags: str = "") -> Run:
    """A one-process run: published as any upload, summarised when its analysis ends."""
    with capture() as published:
        response = post(client, token, path, run=name, branch=branch, commit=name * 4, tags=tags)
    assert response.status_code == 202 and len(published) == 1
    analyse_upload(Upload.objects.get(code=response.json()["id"]).id)
    run = Run.objects.get(name=name)
    assert run.status == Run.Status.DONE, run.status
    return run


def test_a_new_oom_against_the_latest_run_on_main_is_a_regression(
    client: Any, alice_token: str, django_capture_on_commit_callbacks: Any
) -> None:
    base = single(client, alice_token, LIVED, django_capture_on_commit_callbacks, "base", "main")
    assert base.regression is None  # the first run on main has nothing to compare with
    worse = single(client, alice_token, DIED, django_capture_on_commit_callbacks, "worse", "feature")
    reg = worse.regression
    assert reg["regressed"] is True and reg["new_oom"] is True
    grew = reg["peak"][0]
    assert (grew["baseline_bytes"], grew["run_bytes"]) == (peak(LIVED), peak(DIED))
    assert grew["share"] == round((peak(DIED) - peak(LIVED)) / peak(LIVED), 4) == 0.0176
    assert reg["reason"].startswith("Memory regression. Peak reserved memory grew from 4.89 GiB in baseline base")
    assert "ran out of memory (first on rank 0" in reg["reason"]
    assert reg["headline"].startswith("peak +1.76%, new OOM")

    # The gate's question, at the project's 5% and at a stricter 1%: the new OOM fails both.
    gate = client.get("/api/v1/projects/alpha/regression?run=worse&max_regression=1%", **bearer(alice_token)).json()
    assert gate["status"] == "done" and gate["regressed"] is True and gate["baseline"]["name"] == "base"


def test_the_gate_refuses_a_threshold_that_would_put_nan_or_infinity_in_its_json(
    client: Any, alice_token: str, django_capture_on_commit_callbacks: Any
) -> None:
    """Issue 36: ``?max_regression=nan`` answered 200 with ``"max_regression_pct": NaN`` (and ``inf``
    with ``Infinity``), which strict JSON parsers refuse."""
    single(client, alice_token, LIVED, django_capture_on_commit_callbacks, "base", "main")
    single(client, alice_token, DIED, django_capture_on_commit_callbacks, "worse", "feature")
    gate = "/api/v1/projects/alpha/regression?run=worse&max_regression="
    for bad in ("nan", "inf", "-inf", "1e309", "-5", "1000.5"):
        response = client.get(gate + bad, **bearer(alice_token))
        assert response.status_code == 400, (bad, response.content)
        body = json.loads(response.content, parse_constant=pytest.fail)
        assert body["error"]["code"] == "policy:invalid" and "max_regression: " in body["error"]["message"]
    edge = client.get(gate + "1000%", **bearer(alice_token))
    assert edge.status_code == 200
    assert json.loads(edge.content, parse_constant=pytest.fail)["regression"]["max_regression_pct"] == 1000.0


def test_a_smaller_peak_is_no_regression_and_a_pinned_baseline_wins(
    client: Any, alice_token: str, django_capture_on_commit_callbacks: Any
) -> None:
    died = single(client, alice_token, DIED, django_capture_on_commit_callbacks, "died", "main")
    lived = single(client, alice_token, LIVED, django_capture_on_commit_callbacks, "lived", "main")
    assert lived.regression["regressed"] is False
    assert lived.regression["reason"].startswith("No memory regression. Peak reserved memory shrank")
    # Pin the run that lived; the one that died, compared with it now, is a regression.
    pinned = client.post(f"/api/v1/runs/{lived.code}/baseline", **bearer(alice_token)).json()["policy"]
    assert pinned["baseline"] == "pinned" and pinned["baseline_run"] == lived.code
    gate = client.get("/api/v1/projects/alpha/regression?run=died", **bearer(alice_token)).json()
    assert gate["regressed"] is True and gate["baseline"]["name"] == "lived"
    # Growth under the threshold alone is no regression: 1.76% against 5%, but not against 1%.
    runs.baseline_pin(died.project, died)
    again = single(client, alice_token, DIED, django_capture_on_commit_callbacks, "same", "main")
    assert again.regression["regressed"] is False and again.regression["peak"][0]["delta_bytes"] == 0


class Receiver(BaseHTTPRequestHandler):
    """A webhook receiver: answers each POST with the next status of ``statuses`` and keeps what came."""

    statuses: list[int] = []
    seen: list[dict[str, Any]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).seen.append({"headers": dict(self.headers), "body": body})
        status = type(self).statuses.pop(0) if type(self).statuses else 200
        self.send_response(status)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *_args: Any) -> None:
        pass


@pytest.fixture
def receiver(settings: Any) -> Iterator[tuple[str, type[Receiver]]]:
    settings.WEBHOOK_ALLOW_PRIVATE_HOSTS = True  # the receiver is on loopback
    handler = type("R", (Receiver,), {"statuses": [], "seen": []})
    server = HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/hook", handler
    server.shutdown()
    server.server_close()


def test_a_regression_posts_a_signed_webhook_retried_after_a_failure(
    client: Any,
    alice_token: str,
    django_capture_on_commit_callbacks: Any,
    receiver: tuple[str, type[Receiver]],
) -> None:
    url, handler = receiver
    handler.statuses = [503]  # the receiver is down at first
    single(client, alice_token, LIVED, django_capture_on_commit_callbacks, "base", "main")
    saved = client.post(
        "/api/v1/projects/alpha/policy", {"webhook_url": url, "max_regression_pct": "1"}, **bearer(alice_token)
    ).json()["policy"]
    secret = saved["webhook_secret"]
    assert saved["webhook_url"] == url and len(secret) == 64  # the owner (an admin) sees the secret
    single(client, alice_token, DIED, django_capture_on_commit_callbacks, "worse", "feature")
    delivery = WebhookDelivery.objects.get()
    result = runtasks.deliver_webhook.apply(args=[delivery.id])  # eager: its retry runs at once
    assert result.successful()
    delivery.refresh_from_db()
    assert (delivery.attempts, delivery.status_code) == (2, 200) and delivery.delivered_at is not None
    assert len(handler.seen) == 2
    last = handler.seen[-1]
    stamp, raw = last["headers"]["X-Oomscope-Timestamp"], last["body"]
    expected = "sha256=" + hmac.new(secret.encode(), stamp.encode() + b"." + raw, hashlib.sha256).hexdigest()
    assert last["headers"]["X-Oomscope-Signature"] == expected
    assert last["headers"]["Content-Type"] == "application/json"
    body = json.loads(raw)
    assert body["text"].startswith("oomscope: alpha / worse: Memory regression.")
    assert body["oomscope"]["regression"]["new_oom"] is True
    # A second delivery of the same alert is a no-op (the receiver saw it once).
    runtasks.deliver_webhook.apply(args=[delivery.id])
    assert len(handler.seen) == 2


def test_a_receiver_that_refuses_for_good_is_not_retried(
    client: Any, alice_token: str, django_capture_on_commit_callbacks: Any, receiver: tuple[str, type[Receiver]]
) -> None:
    url, handler = receiver
    handler.statuses = [404]
    single(client, alice_token, LIVED, django_capture_on_commit_callbacks, "base", "main")
    runs.policy_update(Run.objects.get().project, webhook_url=url)
    single(client, alice_token, DIED, django_capture_on_commit_callbacks, "worse", "main")
    delivery = WebhookDelivery.objects.get()
    assert runtasks.deliver_webhook.apply(args=[delivery.id]).get() is False
    delivery.refresh_from_db()
    assert (delivery.attempts, delivery.status_code, delivery.delivered_at) == (1, 404, None)
    assert len(handler.seen) == 1


def test_a_webhook_into_the_network_is_refused_unless_allowed(
    client: Any,
    alice_token: str,
    settings: Any,
    django_capture_on_commit_callbacks: Any,
    receiver: tuple[str, type[Receiver]],
) -> None:
    url, handler = receiver
    settings.WEBHOOK_ALLOW_PRIVATE_HOSTS = False  # the default: loopback is the site's own network
    single(client, alice_token, LIVED, django_capture_on_commit_callbacks, "base", "main")
    runs.policy_update(Run.objects.get().project, webhook_url=url)
    single(client, alice_token, DIED, django_capture_on_commit_callbacks, "worse", "main")
    delivery = WebhookDelivery.objects.get()
    assert runtasks.deliver_webhook.apply(args=[delivery.id]).get() is False  # refused, not retried
    delivery.refresh_from_db()
    assert delivery.attempts == 1 and "127.0.0.1, inside the network" in delivery.error
    assert handler.seen == []


def test_a_member_may_not_set_the_webhook_or_the_threshold(
    client: Any, alice: Any, alpha: Any, django_user_model: Any
) -> None:
    from webapp.snapshots.teams import membership, tokens

    carol = django_user_model.objects.create_user("carol", password="pw-carol-123")
    membership.membership_add(team=alpha.team, user=carol, role="member")
    token = tokens.api_token_create(carol)
    denied = client.post("/api/v1/projects/alpha/policy", {"webhook_url": "http://127.0.0.1:9/x"}, **bearer(token))
    assert denied.status_code == 403
    # Issue 36: the threshold is the gate's too, an admin's (a member could raise it to pass the gate).
    threshold = client.post("/api/v1/projects/alpha/policy", {"max_regression_pct": "2.5"}, **bearer(token))
    assert threshold.status_code == 403
    read = client.get("/api/v1/projects/alpha/policy", **bearer(token)).json()
    assert read["policy"]["webhook_secret"] is None  # a member does not see the secret
    assert (RunPolicy.objects.get().webhook_url, RunPolicy.objects.get().max_regression_pct) == ("", 5.0)


def test_trend_chart_marks_ooms_and_filters_by_branch_and_tag(
    client: Any, alice: Any, alice_token: str, django_capture_on_commit_callbacks: Any
) -> None:
    single(client, alice_token, LIVED, django_capture_on_commit_callbacks, "base", "main", tags="nightly")
    single(client, alice_token, DIED, django_capture_on_commit_callbacks, "worse", "feature", tags="h200")
    client.force_login(alice)
    page = client.get("/p/alpha/runs/").content.decode()
    assert page.count('class="trend-point') == 2
    assert page.count('class="trend-point oom regressed"') == 1
    assert "worse (feature): 4.97 GiB, out of memory, regression" in page
    # The snapshots' history links each upload to its run and flags the run that regressed.
    history = client.get("/p/alpha/").content.decode()
    assert history.count('<span class="badge regression">regression</span>') == 1
    main_only = client.get("/p/alpha/runs/?branch=main").content.decode()
    assert main_only.count('class="trend-point') == 1 and "base (main)" in main_only
    tagged = client.get("/p/alpha/runs/?tag=h200").content.decode()
    assert tagged.count('class="trend-point') == 1 and "worse (feature)" in tagged
    listed = client.get("/api/v1/projects/alpha/run-list?branch=feature", **bearer(alice_token)).json()["runs"]
    assert [r["name"] for r in listed] == ["worse"] and listed[0]["regressed"] is True


def test_deleting_a_run_removes_its_uploads_reports_and_files(
    client: Any, alice_token: str, settings: Any, django_capture_on_commit_callbacks: Any
) -> None:
    run = single(client, alice_token, DIED, django_capture_on_commit_callbacks, "gone", "main")
    blob = Path(settings.MEDIA_ROOT) / run.uploads.get().blob_name
    assert blob.exists()
    with django_capture_on_commit_callbacks(execute=True):
        response = client.delete(f"/api/v1/runs/{run.code}", **bearer(alice_token))
    assert response.json() == {"id": run.code, "deleted": True}
    assert not Run.objects.exists() and not Upload.objects.exists()
    assert not blob.exists()


def test_retention_deletes_old_runs_but_keeps_the_pinned_baseline(
    client: Any, alice_token: str, settings: Any, django_capture_on_commit_callbacks: Any
) -> None:
    old = single(client, alice_token, DIED, django_capture_on_commit_callbacks, "old", "main")
    pinned = single(client, alice_token, LIVED, django_capture_on_commit_callbacks, "pinned", "main")
    new = single(client, alice_token, LIVED, django_capture_on_commit_callbacks, "new", "main")
    runs.baseline_pin(old.project, pinned)
    runs.policy_update(old.project, retention_days=30)
    Run.objects.filter(pk__in=[old.pk, pinned.pk]).update(created_at=timezone.now() - timedelta(days=31))
    old_blob = Path(settings.MEDIA_ROOT) / old.uploads.get().blob_name
    with django_capture_on_commit_callbacks(execute=True):
        assert runtasks.purge_old_runs() == 1
    assert set(Run.objects.values_list("name", flat=True)) == {"pinned", "new"}
    assert not old_blob.exists()  # DIED's bytes were that run's alone
    assert new.uploads.get().status == Upload.Status.DONE


def test_the_upload_form_takes_the_jobs_fields(alice_client: Any, django_capture_on_commit_callbacks: Any) -> None:
    page = alice_client.get("/upload/").content.decode()
    for name in ("rank", "world_size", "commit", "branch", "job_id", "error"):
        assert f'name="{name}"' in page
    with RANK_FILES[0].open("rb") as fh, django_capture_on_commit_callbacks() as published:
        response = alice_client.post(
            "/upload/",
            {"file": fh, "project": "alpha", "run": "form-run", "rank": "0", "world_size": "2", "commit": "f00d"},
        )
    assert response.status_code == 302 and published == []  # rank 0 of 2 waits for rank 1
    run = Run.objects.get(name="form-run")
    assert (run.world_size, run.commit, run.status) == (2, "f00d", Run.Status.COLLECTING)
    assert run.uploads.get().rank == 0
    history = alice_client.get("/p/alpha/").content.decode()
    assert 'href="/p/alpha/runs/"' in history


def test_a_rank_whose_analysis_raises_does_not_stop_the_chord(
    client: Any, alice_token: str, django_capture_on_commit_callbacks: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.db import OperationalError

    from webapp.snapshots.worker import tasks

    run = two_rank_run(client, alice_token, django_capture_on_commit_callbacks)
    rank0 = run.uploads.get(rank=0)

    def database_gone(upload_id: int, **_: Any) -> None:
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(tasks, "analyse_upload", database_gone)
    assert runtasks.analyse_rank(rank0.id) == rank0.id  # the part returns; the chord goes on
    # The row is still queued, so the summary waits (and retries) rather than summarising a hole.
    assert runs.run_summarise(run.id) == "pending"


def test_a_run_whose_last_rank_never_comes_is_closed_by_the_beat(
    client: Any,
    alice_token: str,
    settings: Any,
    django_capture_on_commit_callbacks: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with django_capture_on_commit_callbacks():
        post(client, alice_token, RANK_FILES[0], run="lost-rank", rank=0, world_size=2)
    run = Run.objects.get(name="lost-rank")
    published: list[int] = []
    monkeypatch.setattr(runs, "publish_run", published.append)
    settings.RUN_COLLECT_SECONDS = 600
    assert runtasks.close_stale_runs() == 0  # still within its time
    Run.objects.filter(pk=run.pk).update(created_at=timezone.now() - timedelta(seconds=601))
    assert runtasks.close_stale_runs() == 1 and published == [run.pk]
    assert runtasks.close_stale_runs() == 0  # once
    assert analyse_as_the_chord_would(run) == "done"
    assert Run.objects.get(pk=run.pk).summary["run"]["missing_ranks"] == [1]
