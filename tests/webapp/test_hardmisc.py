"""Issue 36 items 5-6 in the web tier: each finding as the attack's shape, refused.

Uploads are real fixtures (gpt_varlen_oom, its own OOM message from its ``.truth.json``).
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import socket
import tarfile
import threading
import zipfile
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from tests.webapp.helpers import GPT_OOM, bearer, make_upload
from webapp.snapshots.models import ApiToken, PolicyChange, Run, RunPolicy, Upload, WebhookDelivery
from webapp.snapshots.runs import webhooks
from webapp.snapshots.runs.webhooks import WebhookError

pytestmark = pytest.mark.django_db

OOM_MESSAGE = json.loads(GPT_OOM.with_name("gpt_varlen_oom.truth.json").read_text())["oom_message"]


def _flashes(response: Any) -> list[str]:
    return [str(m) for m in response.wsgi_request._messages]


# --- re-analysis with a pasted OOM message -----------------------------------------------------


def _reanalyse(client: Any, upload: Upload) -> Any:
    return client.post(f"/s/{upload.code}/message/", {"oom_message": OOM_MESSAGE})


def test_reanalysis_is_held_to_the_upload_rate(alice_client: Any, alice: Any, alpha: Any, settings: Any) -> None:
    """Issue 36: 25 re-analysis posts in 1.9 s, none counted. Now each is an upload to the rates."""
    settings.UPLOAD_RATE_PER_USER = "3/h"
    upload = make_upload(alpha, alice)
    for _ in range(3):
        assert _reanalyse(alice_client, upload).status_code == 302
    assert Upload.objects.count() == 4
    refused = _reanalyse(alice_client, upload)
    assert refused.status_code == 302 and refused["Location"].endswith(f"/s/{upload.code}/#basis")
    assert Upload.objects.count() == 4
    assert any("upload" in text.lower() for text in _flashes(refused))


def test_reanalysis_is_held_to_the_quota_the_queued_cost_and_the_disk(
    alice_client: Any, alice: Any, alpha: Any, settings: Any
) -> None:
    upload = make_upload(alpha, alice, estimated_cost=1000)
    size = upload.bytes
    # The quota: room for the file twice, not three times (the re-analysis row counts it again).
    settings.TEAM_STORAGE_QUOTA_BYTES = 2 * size + 10
    assert _reanalyse(alice_client, upload).status_code == 302
    assert Upload.objects.count() == 2
    quota = _reanalyse(alice_client, upload)
    assert Upload.objects.count() == 2
    assert any("quota" in text for text in _flashes(quota))
    settings.TEAM_STORAGE_QUOTA_BYTES = 100 * size
    # The team's queued cost: the first re-analysis (cost 1000) still queued, room for no other.
    settings.ANALYSIS_MAX_QUEUED_COST_PER_TEAM = 1500
    _reanalyse(alice_client, upload)
    assert Upload.objects.count() == 2
    settings.ANALYSIS_MAX_QUEUED_COST_PER_TEAM = 10**12
    # The disk guard: a reserve larger than the disk.
    settings.DISK_MIN_FREE_BYTES = 1 << 62
    full = _reanalyse(alice_client, upload)
    assert Upload.objects.count() == 2
    assert full.status_code == 302 and _flashes(full)
    settings.DISK_MIN_FREE_BYTES = 0
    assert _reanalyse(alice_client, upload).status_code == 302
    assert Upload.objects.count() == 3


# --- the webhook's destination (issue 36) and its settings (issue 35) ----------------------------

PUBLIC = "93.184.216.34"  # a global address no test connects to for real


class _Receiver(BaseHTTPRequestHandler):
    """Answers each POST with ``answer`` (status, headers) and keeps what came."""

    answer: tuple[int, dict[str, str]] = (200, {})
    seen: list[dict[str, Any]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).seen.append({"path": self.path, "headers": dict(self.headers), "body": body})
        status, headers = type(self).answer
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *_args: Any) -> None:
        pass


@pytest.fixture
def receivers() -> Iterator[Callable[[tuple[int, dict[str, str]]], tuple[int, type[_Receiver]]]]:
    """Start real HTTP receivers on 127.0.0.1: ``start(answer)`` -> (port, handler class)."""
    servers: list[HTTPServer] = []

    def start(answer: tuple[int, dict[str, str]] = (200, {})) -> tuple[int, type[_Receiver]]:
        handler = type("R", (_Receiver,), {"answer": answer, "seen": []})
        server = HTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server.server_port, handler

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    "url",
    [
        "http://100.64.0.1/hook",  # shared address space (carrier-grade NAT): passed before
        "http://169.254.169.254/latest/meta-data",
        "http://127.0.0.1:6379/",
        "http://10.1.2.3/",
        "http://[::ffff:127.0.0.1]/",
        "http://[fd00::1]/",
        "http://0.0.0.0/",
    ],
)
def test_every_address_that_is_not_global_is_refused(url: str) -> None:
    with pytest.raises(WebhookError) as refused:
        webhooks.check_destination(url, allow_private=False)
    assert not refused.value.retry and "inside the network" in str(refused.value)
    assert webhooks.check_destination(f"http://{PUBLIC}/hook", allow_private=False) == (PUBLIC, 80, PUBLIC)


def _resolver(monkeypatch: pytest.MonkeyPatch, answers: list[str]) -> list[str]:
    """``socket.getaddrinfo`` for ``hooks.example`` answers ``answers`` in turn (the last one again
    after that); every other name resolves as usual. Returns the names asked, in order."""
    real = socket.getaddrinfo
    asked: list[str] = []

    def fake(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host != "hooks.example":
            return real(host, port, *args, **kwargs)
        asked.append(host)
        address = answers[min(len(asked), len(answers)) - 1]
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]

    monkeypatch.setattr(socket, "getaddrinfo", fake)
    return asked


def _connector(monkeypatch: pytest.MonkeyPatch, public_port: int | None) -> list[tuple[str, int]]:
    """``socket.create_connection`` that resolves a name as the (fake) resolver says, sends the
    public address to the receiver on ``public_port`` (it stands in for the attacker's public server)
    or refuses it (None), and connects to loopback for real. Returns where each connection went."""
    real = socket.create_connection
    went: list[tuple[str, int]] = []

    def fake(address: tuple[str, int], *args: Any, **kwargs: Any) -> socket.socket:
        host, port = address
        resolved = socket.getaddrinfo(host, port)[0][4][0]
        went.append((resolved, port))
        if resolved == PUBLIC:
            if public_port is None:
                raise OSError("the test's public address takes no connection")
            return real(("127.0.0.1", public_port), *args, **kwargs)
        return real((resolved, port), *args, **kwargs)

    monkeypatch.setattr(socket, "create_connection", fake)
    return went


def test_the_name_is_resolved_once_and_that_address_is_the_one_connected_to(
    monkeypatch: pytest.MonkeyPatch, receivers: Any
) -> None:
    """DNS rebinding: the name answers a public address to the check and 127.0.0.1 to the connection.
    Before: the check passed, urllib resolved again and the POST reached the loopback receiver."""
    port, inside = receivers()
    asked = _resolver(monkeypatch, [PUBLIC, "127.0.0.1"])
    went = _connector(monkeypatch, public_port=None)
    with pytest.raises(WebhookError, match="cannot reach the receiver"):
        webhooks.post(f"http://hooks.example:{port}/hook", "s", {"text": "x"}, timeout=5)
    assert asked == ["hooks.example"] and went == [(PUBLIC, port)]
    assert inside.seen == []


def test_a_redirect_is_never_followed(monkeypatch: pytest.MonkeyPatch, receivers: Any) -> None:
    """A public receiver that answers 302 to an address inside the network. Before: urllib followed
    it, unchecked, and POSTed to the inside receiver."""
    inside_port, inside = receivers()
    public_port, public = receivers((302, {"Location": f"http://127.0.0.1:{inside_port}/internal"}))
    _resolver(monkeypatch, [PUBLIC])
    _connector(monkeypatch, public_port=public_port)
    with pytest.raises(WebhookError) as refused:
        webhooks.post(f"http://hooks.example:{public_port}/hook", "s", {"text": "x"}, timeout=5)
    assert refused.value.status == 302 and not refused.value.retry
    assert "redirects are not followed" in str(refused.value)
    assert len(public.seen) == 1 and public.seen[0]["headers"]["Host"] == f"hooks.example:{public_port}"
    assert inside.seen == []


def test_a_webhook_is_validated_on_save_and_says_what_to_set(
    client: Any, alpha: Any, alice_token: str, settings: Any, receivers: Any
) -> None:
    settings.SITE_URL = ""
    refused = client.post(
        "/api/v1/projects/alpha/policy", {"webhook_url": "http://10.1.2.3/hook"}, **bearer(alice_token)
    )
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["code"] == "policy:invalid" and "10.1.2.3, inside the network" in error["message"]
    assert "WEBHOOK_ALLOW_PRIVATE_HOSTS" in error["message"]
    assert _policy(alpha).webhook_url == ""
    # The test-only allowance (a receiver on loopback): saved, with the relative link's warning.
    settings.WEBHOOK_ALLOW_PRIVATE_HOSTS = True
    port, _handler = receivers()
    saved = client.post(
        "/api/v1/projects/alpha/policy", {"webhook_url": f"http://127.0.0.1:{port}/h"}, **bearer(alice_token)
    ).json()
    assert saved["policy"]["webhook_url"] == f"http://127.0.0.1:{port}/h"
    assert any("SITE_URL" in w and "relative" in w for w in saved["warnings"])
    settings.SITE_URL = "https://oomscope.example.com"
    again = client.post("/api/v1/projects/alpha/policy", {"max_regression_pct": "4"}, **bearer(alice_token)).json()
    assert "warnings" not in again


def test_send_a_test_reaches_a_real_local_receiver_signed(
    client: Any, alice_client: Any, alice_token: str, settings: Any, receivers: Any
) -> None:
    settings.WEBHOOK_ALLOW_PRIVATE_HOSTS = True  # the explicit test-only allowance: the receiver is on loopback
    settings.SITE_URL = "https://oomscope.example.com"
    port, handler = receivers()
    policy = client.post(
        "/api/v1/projects/alpha/policy", {"webhook_url": f"http://127.0.0.1:{port}/hook"}, **bearer(alice_token)
    ).json()["policy"]
    sent = client.post("/api/v1/projects/alpha/webhook/test", **bearer(alice_token)).json()
    assert sent == {"delivered": True, "status": 200, "error": ""}
    seen = handler.seen[-1]
    stamp, raw = seen["headers"]["X-Oomscope-Timestamp"], seen["body"]
    digest = hmac.new(policy["webhook_secret"].encode(), f"{stamp}.".encode() + raw, hashlib.sha256).hexdigest()
    assert seen["headers"]["X-Oomscope-Signature"] == f"sha256={digest}"
    body = json.loads(raw)
    assert body["oomscope"] == {"project": "alpha", "test": True, "url": "https://oomscope.example.com/p/alpha/runs/"}
    # The page's button: the same test, its outcome in the flash; a receiver that answers 500 says so.
    handler.answer = (500, {})
    page = alice_client.post("/p/alpha/runs/", {"action": "test-webhook"})
    assert page.status_code == 302 and len(handler.seen) == 2
    assert any("not delivered: HTTP 500 from the receiver" in text for text in _flashes(page))


def test_each_delivery_s_status_and_last_error_are_on_the_settings_page(
    alice_client: Any, alice: Any, alpha: Any, settings: Any
) -> None:
    from webapp.snapshots.runs import runs

    settings.WEBHOOK_ALLOW_PRIVATE_HOSTS = True
    runs.policy_update(alpha, webhook_url="http://127.0.0.1:9/hook")
    first = Run.objects.create(project=alpha, name="nightly-41", code=runs.new_run_code())
    second = Run.objects.create(project=alpha, name="nightly-42", code=runs.new_run_code())
    WebhookDelivery.objects.create(run=first, url="http://127.0.0.1:9/hook", attempts=1, status_code=200)
    WebhookDelivery.objects.filter(run=first).update(delivered_at=first.created_at)
    WebhookDelivery.objects.create(
        run=second, url="http://127.0.0.1:9/hook", attempts=5, error="cannot reach the receiver: refused"
    )
    page = alice_client.get("/p/alpha/runs/").content.decode()
    table = page[page.index("Webhook deliveries") :]
    assert 'nightly-42</td><td>failed</td><td class="num">5</td><td>cannot reach the receiver: refused' in table
    assert "nightly-41</td><td>delivered (HTTP 200)</td>" in table
    assert "Send a test alert" in page


# --- the gate's answer: a read-only scope, an admin's settings, recorded (issue 36) ------------


def _policy(project: Any) -> RunPolicy:
    from webapp.snapshots.runs import runs

    return runs.policy_for(project)


def _member(alpha: Any, django_user_model: Any, role: str) -> Any:
    from webapp.snapshots.teams import membership

    user = django_user_model.objects.create_user(f"carol-{role}", password="pw-carol-123")
    membership.membership_add(team=alpha.team, user=user, role=role)
    return user


def test_a_gate_token_reads_the_gate_and_changes_nothing(client: Any, alice: Any, alpha: Any) -> None:
    from webapp.snapshots.runs import runs
    from webapp.snapshots.teams import tokens

    gate = tokens.api_token_create(alice, project=alpha, scope="gate")
    run = Run.objects.create(project=alpha, name="r1", code=runs.new_run_code())
    assert client.get("/api/v1/projects/alpha/regression?run=r1", **bearer(gate)).status_code == 200
    for path, data in (
        ("/api/v1/projects/alpha/policy", {"max_regression_pct": "500"}),
        (f"/api/v1/runs/{run.code}/baseline", {}),
    ):
        refused = client.post(path, data, **bearer(gate))
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "token:read-only"
    with GPT_OOM.open("rb") as fh:
        upload = client.post("/api/v1/snapshots", {"file": fh, "run": "r1"}, **bearer(gate))
    assert upload.status_code == 403 and Upload.objects.count() == 0
    assert _policy(alpha).max_regression_pct == 5.0 and _policy(alpha).baseline_run is None


def test_baseline_and_threshold_are_an_admin_s_and_each_change_is_recorded(
    client: Any, alice_client: Any, alice: Any, alpha: Any, django_user_model: Any
) -> None:
    """Issue 36: any member (or CI token) pinned the run under test as its own baseline and raised
    the threshold, and the gate then said "no regression"."""
    from webapp.snapshots.runs import runs
    from webapp.snapshots.teams import tokens

    member = _member(alpha, django_user_model, "member")
    member_token = tokens.api_token_create(member)
    run = Run.objects.create(project=alpha, name="under-test", code=runs.new_run_code())
    assert client.post(f"/api/v1/runs/{run.code}/baseline", **bearer(member_token)).status_code == 403
    assert (
        client.post("/api/v1/projects/alpha/policy", {"max_regression_pct": "900"}, **bearer(member_token)).status_code
        == 403
    )
    client.force_login(member)
    client.post(f"/run/{run.code}/", {"action": "pin"})
    client.post("/p/alpha/runs/", {"max_regression_pct": "900"})
    assert _policy(alpha).baseline_run is None and _policy(alpha).max_regression_pct == 5.0
    assert not PolicyChange.objects.exists()
    # The owner: allowed, and recorded with who and what (and the token's prefix through the API).
    admin_token = tokens.api_token_create(alice)
    assert client.post(f"/api/v1/runs/{run.code}/baseline", **bearer(admin_token)).status_code == 200
    assert (
        client.post("/api/v1/projects/alpha/policy", {"max_regression_pct": "1"}, **bearer(admin_token)).status_code
        == 200
    )
    changes = client.get("/api/v1/projects/alpha/policy", **bearer(admin_token)).json()["changes"]
    prefix = ApiToken.objects.get(user=alice, project=None, default_project=None).prefix
    assert [(c["user"], c["token"], c["what"]) for c in changes] == [
        ("alice", prefix, "max_regression_pct: 5.0 -> 1.0"),
        ("alice", prefix, "baseline: the latest run on main -> under-test"),
    ]


def test_a_project_scoped_token_neither_changes_the_webhook_nor_reads_its_secret(
    client: Any, alice: Any, alpha: Any, settings: Any
) -> None:
    from webapp.snapshots.runs import runs
    from webapp.snapshots.teams import tokens

    settings.WEBHOOK_ALLOW_PRIVATE_HOSTS = True
    runs.policy_update(alpha, webhook_url="http://127.0.0.1:9/hook")
    scoped = tokens.api_token_create(alice, project=alpha)  # the owner's, limited to alpha (a CI job's)
    read = client.get("/api/v1/projects/alpha/policy", **bearer(scoped)).json()
    assert read["policy"]["webhook_url"] == "http://127.0.0.1:9/hook" and read["policy"]["webhook_secret"] is None
    moved = client.post("/api/v1/projects/alpha/policy", {"webhook_url": "http://127.0.0.1:10/x"}, **bearer(scoped))
    assert moved.status_code == 403
    assert _policy(alpha).webhook_url == "http://127.0.0.1:9/hook"
    assert client.post("/api/v1/projects/alpha/webhook/test", **bearer(scoped)).status_code == 403


# --- a full disk at the final write (issue 36: the analysis was lost for good) ------------------


def test_a_full_disk_at_the_final_write_parks_the_result_and_the_sweep_stores_it(
    alice: Any, alpha: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.db import OperationalError

    from webapp.snapshots.models import Report
    from webapp.snapshots.worker import jobs, tasks

    upload = make_upload(alpha, alice, oom_message=OOM_MESSAGE)
    real_finish = jobs.upload_finish
    calls: list[int] = []

    def full_once(upload_id: int, **kwargs: Any) -> bool:
        calls.append(upload_id)
        if len(calls) == 1:
            raise OperationalError("database or disk is full")  # SQLite's SQLITE_FULL
        return real_finish(upload_id, **kwargs)

    monkeypatch.setattr(jobs, "upload_finish", full_once)
    tasks.analyse_upload(upload.id)
    upload.refresh_from_db()
    assert upload.status == Upload.Status.RUNNING and upload.error_code == ""  # not failed: kept
    parked = tasks.pending_dir() / f"{upload.id}.json"
    # The whole result waits on disk; the page may already show the report as the first answer (issue 34:
    # stored before the charts, the final report byte for byte), but the upload is done only once it is stored.
    assert parked.exists()
    first_answer = Report.objects.filter(upload=upload).first()
    assert first_answer is None or first_answer.data["devices"][0]["summary"]["peak_reserved_bytes"] > 0
    tasks.sweep_uploads()  # the beat's sweep: the disk has room again
    upload.refresh_from_db()
    assert upload.status == Upload.Status.DONE and not parked.exists()
    report = Report.objects.get(upload=upload).data
    truth = json.loads(GPT_OOM.with_name("gpt_varlen_oom.truth.json").read_text())
    assert report["devices"][0]["summary"]["peak_reserved_bytes"] == truth["memory_stats"]["reserved_bytes.all.peak"]
    assert calls == [upload.id, upload.id] and upload.attempts == 1  # stored, not analysed again


def test_a_parked_result_waits_while_the_disk_is_still_full(
    alice: Any, alpha: Any, monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    from django.db import OperationalError

    from webapp.snapshots.worker import jobs, tasks

    upload = make_upload(alpha, alice)
    Upload.objects.filter(pk=upload.pk).update(status=Upload.Status.RUNNING, claimed_by="gone:1:1")
    tasks.park_result(upload.id, {"report": {"devices": []}, "charts": {}, "stored_bytes": 0})

    def full(*_args: Any, **_kwargs: Any) -> bool:
        raise OperationalError("database or disk is full")

    monkeypatch.setattr(jobs, "upload_finish", full)
    settings.SWEEP_STALE_RUNNING_SECONDS = -1  # every running row is stale to the sweep
    assert tasks.store_parked_results() == (0, {upload.id})
    tasks.sweep_uploads()
    upload.refresh_from_db()
    assert upload.status == Upload.Status.RUNNING  # neither failed nor analysed again
    assert (tasks.pending_dir() / f"{upload.id}.json").exists()


# --- crafted rank archives (issue 36: HTML 500s from the API) ----------------------------------

RANK0 = GPT_OOM.parents[0] / "runs" / "ddp_gloo_rank0.pickle.gz"


def _tar(members: list[tuple[str, bytes]], mode: str = "w") -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode=mode) as archive:  # type: ignore[call-overload]
        for name, blob in members:
            info = tarfile.TarInfo(name)
            info.size = len(blob)
            archive.addfile(info, io.BytesIO(blob))
    return out.getvalue()


def _zip(members: list[tuple[str, bytes]]) -> bytearray:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as archive:
        for name, blob in members:
            archive.writestr(name, blob)
    return bytearray(out.getvalue())


def _crafted(kind: str) -> tuple[str, bytes]:
    snap = RANK0.read_bytes()
    if kind == "bad-crc":
        data = _zip([("rank0.pickle.gz", snap)])
        data[data.find(snap[:64]) + 100] ^= 0xFF
        return "ranks.zip", bytes(data)
    if kind in ("encrypted", "unknown-method"):
        data = _zip([("rank0.pickle.gz", snap)])
        central = data.rfind(b"PK\x01\x02")
        if kind == "encrypted":
            data[6] |= 1  # the "encrypted" flag, local header and central directory
            data[central + 8] |= 1
        else:
            data[8] = data[central + 10] = 99  # compression method 99 (AES), in both headers
        return "ranks.zip", bytes(data)
    if kind == "truncated-gz":
        whole = _tar([("rank0.pickle.gz", snap)], "w:gz")
        return "ranks.tar.gz", whole[: len(whole) // 2]
    if kind == "damaged-xz":
        data = bytearray(_tar([("rank0.pickle.gz", snap)], "w:xz"))
        data[len(data) // 2] ^= 0xFF
        data[len(data) // 2 + 1] ^= 0xFF
        return "ranks.tar.xz", bytes(data)
    if kind == "long-name":
        return "ranks.tar", _tar([("r" * 300 + ".pickle.gz", snap)])
    assert kind == "deep-sidecar"
    return "ranks.tar", _tar([("rank0.pickle.gz", snap), ("rank0.json", b"[" * 200_000 + b"]" * 200_000)])


@pytest.mark.parametrize(
    "kind", ["bad-crc", "encrypted", "unknown-method", "truncated-gz", "damaged-xz", "long-name", "deep-sidecar"]
)
def test_a_crafted_rank_archive_is_a_json_refusal_not_a_500(client: Any, alice_token: str, kind: str) -> None:
    name, data = _crafted(kind)
    client.raise_request_exception = False  # the finding was Django's HTML 500 page
    upload = SimpleUploadedFile(name, data)
    response = client.post("/api/v1/snapshots", {"file": upload, "run": "r"}, **bearer(alice_token))
    assert response.status_code == 422, (kind, response.status_code, response.content[:300])
    assert response["Content-Type"].startswith("application/json")
    assert response.json()["error"]["code"] == "upload:archive-unreadable"
    assert Upload.objects.count() == 0 and Run.objects.count() == 0


# --- the invite form (issue 36: it told whether an account or e-mail exists) --------------------


def test_the_invite_form_answers_the_same_whether_an_account_exists_or_not(
    alice_client: Any, alpha: Any, django_user_model: Any
) -> None:
    import re

    from webapp.snapshots.models import Invitation, Membership

    django_user_model.objects.create_user("carol", email="carol@corp.example", password="pw-carol-123")
    team = f"/t/{alpha.team.slug}/"
    answers = {}
    for who in ("carol", "mallory", "carol@corp.example", "nobody@corp.example"):
        page = alice_client.post(team, {"action": "invite", "who": who, "role": "viewer"}, follow=True)
        text = page.content.decode()
        flash = re.search(r'<li class="[^"]*">([^<]*is invited as[^<]*)</li>', text)
        assert flash, text[:2000]
        answers[who] = flash.group(1).replace(who, "WHO")
        # The pending list shows what was typed, the same way for an account and for no account.
        assert f'<tr data-invited="{who}"><td>{who}</td><td>viewer</td><td>alice</td>' in text
    assert len(set(answers.values())) == 1, answers
    assert not Membership.objects.filter(team=alpha.team).exclude(user__username="alice").exists()
    # A pending invitation that names no account is withdrawn as any other.
    alice_client.post(team, {"action": "cancel_invitation", "username": "mallory"})
    # (carol's account, invited by name then by e-mail, holds one invitation: the last spelling.)
    assert sorted(Invitation.objects.values_list("invited_as", flat=True)) == [
        "carol@corp.example",
        "nobody@corp.example",
    ]


def test_a_finished_run_s_rank_is_replaced_by_an_admin_only(
    client: Any, alice: Any, alpha: Any, django_user_model: Any
) -> None:
    """Issue 36's third way to flip the gate: a member re-uploaded a good file under the finished
    run's name (a one-process run's later upload replaces its rank), and the run was no longer a
    regression."""
    from webapp.snapshots.runs import runs
    from webapp.snapshots.teams import tokens

    member_token = tokens.api_token_create(_member(alpha, django_user_model, "member"))
    finished = Run.objects.create(project=alpha, name="regressed", code=runs.new_run_code(), status=Run.Status.DONE)
    with GPT_OOM.open("rb") as fh:
        refused = client.post("/api/v1/snapshots", {"file": fh, "run": "regressed"}, **bearer(member_token))
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "run:finished"
    assert Upload.objects.count() == 0
    with GPT_OOM.open("rb") as fh:  # a new name is any upload
        assert client.post("/api/v1/snapshots", {"file": fh, "run": "rerun"}, **bearer(member_token)).status_code == 202
    with GPT_OOM.open("rb") as fh:  # the owner may still replace it
        owner = client.post(
            "/api/v1/snapshots", {"file": fh, "run": "regressed"}, **bearer(tokens.api_token_create(alice))
        )
    assert owner.status_code == 202 and Upload.objects.filter(run_ref=finished).count() == 1


def test_the_tokens_page_makes_a_gate_token(alice_client: Any, alpha: Any) -> None:
    page = alice_client.post("/tokens/", {"action": "create", "name": "ci gate", "project": "alpha", "scope": "gate"})
    assert page.status_code == 200
    made = ApiToken.objects.get(name="ci gate")
    assert (made.scope, made.project_id) == ("gate", alpha.pk)
    assert "project alpha only, read only (gate)" in alice_client.get("/tokens/").content.decode()
    plain = alice_client.post("/tokens/", {"action": "create", "name": "uploader"})
    assert plain.status_code == 200 and ApiToken.objects.get(name="uploader").scope == "full"
