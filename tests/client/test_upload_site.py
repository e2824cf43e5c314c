"""The client against the real site: gunicorn + a Celery worker + Redis, on the test database.

Every refusal the API gives an upload is provoked through ``oomscope_client.upload`` (and the
CLI): the status and code are the site's own, and the client names the code and what to do.
The success path uploads the real gpt_varlen_oom capture, waits for the worker, and reads the
report's figures back against the process's own ``torch.cuda.memory_stats`` (truth file).
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
import subprocess
import sys
import time
import urllib.request
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from oomscope_client.upload import HINT_PREFIXES, HINTS, UploadError, upload

from tests.client.conftest import SITE_CAP, Site

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
GPT_OOM = FIXTURES / "gpt_varlen_oom.pickle.gz"
TRUTH = json.loads((FIXTURES / "gpt_varlen_oom.truth.json").read_text())


@pytest.fixture
def people(django_user_model: Any) -> dict[str, Any]:
    """Alice owns team A (project alpha) and is a member of team C (gamma); Bob owns team B; Vera views A."""
    from webapp.snapshots.teams import membership

    alice = django_user_model.objects.create_user("alice", password="pw-alice-123")
    bob = django_user_model.objects.create_user("bob", password="pw-bob-123")
    vera = django_user_model.objects.create_user("vera", password="pw-vera-123")
    team_a = membership.team_create(name="Team A", slug="team-a", owner=alice)
    alpha = membership.project_create(team=team_a, name="Alpha", slug="alpha")
    membership.project_create(
        team=membership.team_create(name="Team B", slug="team-b", owner=bob), name="Beta", slug="beta"
    )
    team_c = membership.team_create(name="Team C", slug="team-c", owner=bob)
    membership.project_create(team=team_c, name="Gamma", slug="gamma")
    membership.membership_add(team=team_c, user=alice, role="member")
    membership.membership_add(team=team_a, user=vera, role="viewer")
    return {"alice": alice, "bob": bob, "vera": vera, "alpha": alpha}


def token_of(user: Any, **kwargs: Any) -> str:
    from webapp.snapshots.teams import tokens

    return tokens.api_token_create(user, **kwargs)


def get_json(url: str, token: str) -> dict[str, Any]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})  # noqa: S310 - loopback
    with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310
        return json.loads(response.read())  # type: ignore[no-any-return]


def wait_done(site: Site, api_url: str, token: str, timeout: float = 180.0) -> dict[str, Any]:
    # Generous: the 2-core box is shared; the analysis itself takes a few seconds when idle.
    deadline = time.monotonic() + timeout
    while True:
        body = get_json(api_url, token)
        if body["status"] in ("done", "failed"):
            return body
        if time.monotonic() > deadline:
            pytest.fail(f"still {body['status']} after {timeout} s\n{site.logs()}")
        time.sleep(0.3)


def refused(site: Site, path: Path, token: str, **fields: Any) -> UploadError:
    with pytest.raises(UploadError) as info:
        upload(path, site.url, token, timeout=60, **fields)
    return info.value


def assert_refusal(error: UploadError, status: int, code: str, message: str, choices: list[str] | None = None) -> None:
    assert (error.status, error.code) == (status, code), (error.status, error.code, str(error))
    expected: dict[str, Any] = {"code": code, "message": message}
    if choices is not None:  # a refusal about the project lists the ones that would do
        expected["choices"] = choices
    assert error.payload == {"error": expected}
    assert f"HTTP {status}: {code}: {message}" in str(error)
    if error.hint:
        assert str(error).endswith(f"({error.hint})")


def test_success_path_report_figures_equal_the_truth_file(live_site: Site, people: dict[str, Any]) -> None:
    token = token_of(people["alice"])
    result = upload(GPT_OOM, live_site.url, token, project="alpha", run="client-e2e", tags=["gpt", "h200"])
    assert result["status"] == "queued" and set(result) >= {"id", "status", "url", "api_url"}
    assert result["api_url"] == f"{live_site.url}/api/v1/snapshots/{result['id']}"
    status = wait_done(live_site, result["api_url"], token)
    assert status["status"] == "done", (status, live_site.logs())
    assert (status["project"], status["run"], status["tags"]) == ("alpha", "client-e2e", ["gpt", "h200"])
    assert status["bytes"] == GPT_OOM.stat().st_size == 257016
    report = get_json(result["api_url"] + "/report", token)
    stats = TRUTH["memory_stats"]
    device = report["devices"][0]
    assert device["summary"]["peak_reserved_bytes"] == stats["reserved_bytes.all.peak"]
    assert device["summary"]["peak_allocated_bytes"] == stats["allocated_bytes.all.peak"]
    assert device["summary"]["peak_requested_bytes"] == stats["requested_bytes.all.peak"]
    assert status["summary"]["oom"] is True and device["oom"] is not None
    assert report["source"]["filename"] == GPT_OOM.name
    _wait_run_summarised("client-e2e")


def _wait_run_summarised(name: str, timeout: float = 60.0) -> None:
    """The upload's run is summarised by a task of its own after the upload is done (its summary, the
    gate's policy row, the regression): wait for that write to commit before the test's database is
    flushed, or the flush and the worker's write deadlock (PostgreSQL)."""
    from webapp.snapshots.models import Run

    deadline = time.monotonic() + timeout
    while not Run.objects.filter(name=name, status=Run.Status.DONE).exists():
        assert time.monotonic() < deadline, f"run {name!r} not summarised in {timeout:.0f} s"
        time.sleep(0.2)


@pytest.mark.parametrize("state", ["unknown", "revoked", "expired", "inactive-user"])
def test_a_dead_token_is_401_auth_invalid_token(live_site: Site, people: dict[str, Any], state: str) -> None:
    from django.utils import timezone

    from webapp.snapshots import messages
    from webapp.snapshots.models import ApiToken

    alice = people["alice"]
    if state == "unknown":
        token = "oom_" + "x" * 43
    elif state == "expired":
        token = token_of(alice, expires_at=timezone.now() - timedelta(minutes=1))
    else:
        token = token_of(alice)
    if state == "revoked":
        ApiToken.objects.update(revoked_at=timezone.now())
    if state == "inactive-user":
        alice.is_active = False
        alice.save()
    error = refused(live_site, GPT_OOM, token, project="alpha")
    assert_refusal(error, 401, "auth-invalid-token", messages.BAD_API_KEY)
    assert "make a new one" in error.hint


def test_another_teams_project_is_404_unknown_project(live_site: Site, people: dict[str, Any]) -> None:
    error = refused(live_site, GPT_OOM, token_of(people["alice"]), project="beta")
    choices = "Projects you can upload to: alpha, gamma (send one as the field 'project', or --project SLUG)."
    message = f"No project 'beta' that you can upload to. {choices}"
    assert_refusal(error, 404, "upload:unknown-project", message, ["alpha", "gamma"])
    assert "check --project" in error.hint


def test_no_project_with_several_is_400_no_project(live_site: Site, people: dict[str, Any]) -> None:
    error = refused(live_site, GPT_OOM, token_of(people["alice"]))  # alpha and gamma
    choices = "Projects you can upload to: alpha, gamma (send one as the field 'project', or --project SLUG)."
    assert_refusal(error, 400, "upload:no-project", f"Choose a project to upload to. {choices}", ["alpha", "gamma"])


def test_a_viewer_is_403_read_only(live_site: Site, people: dict[str, Any]) -> None:
    error = refused(live_site, GPT_OOM, token_of(people["vera"]), project="alpha")
    message = (
        "You can read this project but not upload to it (your role is viewer). You can upload to no project: "
        "ask a team's admin to make you a member, or create a team."
    )
    assert_refusal(error, 403, "upload:read-only", message, [])
    assert "ask an admin of the team" in error.hint


def test_a_field_over_its_limit_is_400_invalid(live_site: Site, people: dict[str, Any]) -> None:
    error = refused(live_site, GPT_OOM, token_of(people["alice"]), project="alpha", run="r" * 201)
    assert_refusal(error, 400, "upload:invalid", "run: Ensure this value has at most 200 characters (it has 201).")


def test_a_file_over_the_cap_is_413_too_large_and_the_cap_itself_passes(
    live_site: Site, people: dict[str, Any], tmp_path: Path
) -> None:
    from webapp.snapshots.models import Upload

    token = token_of(people["alice"])
    over = tmp_path / "over.pickle"
    over.write_bytes(b"\x80\x04" + b"\0" * (SITE_CAP - 1))  # SITE_CAP + 1 bytes
    error = refused(live_site, over, token, project="alpha")
    assert_refusal(error, 413, "upload:too-large", "The file is larger than the 1.0 MiB upload limit.")
    at_cap = tmp_path / "at-cap.pickle"
    at_cap.write_bytes(b"\x80\x04" + b"\0" * (SITE_CAP - 2))
    accepted = upload(at_cap, live_site.url, token, project="alpha")
    assert Upload.objects.get(code=accepted["id"]).bytes == SITE_CAP


def test_a_body_far_over_the_cap_is_refused_before_it_is_sent(
    live_site: Site, people: dict[str, Any], tmp_path: Path
) -> None:
    """The site answers 413 from the Content-Length alone; the client reads that answer."""
    big = tmp_path / "big.pickle"
    with big.open("wb") as f:
        f.write(b"\x80\x04")
        f.truncate(8 * SITE_CAP)
    error = refused(live_site, big, token_of(people["alice"]), project="alpha")
    assert_refusal(error, 413, "upload:too-large", "The file is larger than the 1.0 MiB upload limit.")


@pytest.mark.parametrize(
    ("content", "code", "message"),
    [
        (b"", "snapshot:format:empty", "The file is empty (0 bytes): the dump never finished"),
        (
            b"<!doctype html><title>Sign in</title>",
            "snapshot:format:html",
            "This is an HTML page, not a snapshot. Upload the file written by torch.cuda.memory._dump_snapshot().",
        ),
    ],
)
def test_a_non_snapshot_is_422(
    live_site: Site, people: dict[str, Any], tmp_path: Path, content: bytes, code: str, message: str
) -> None:
    path = tmp_path / "not-a-snapshot.pickle"
    path.write_bytes(content)
    error = refused(live_site, path, token_of(people["alice"]), project="alpha")
    assert error.status == 422 and error.code == code
    assert error.payload["error"]["message"].startswith(message)
    assert "_dump_snapshot() wrote" in error.hint


class Canary:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.path}",))


def test_a_hostile_pickle_is_accepted_then_failed_unsafe_without_running(
    live_site: Site, people: dict[str, Any], tmp_path: Path
) -> None:
    """Only the worker's reader can tell: the upload is 202, the analysis fails with snapshot:unsafe:*."""
    canary = tmp_path / "canary"
    path = tmp_path / "evil.pickle.gz"
    path.write_bytes(gzip.compress(pickle.dumps({"segments": [], "device_traces": [[Canary(canary)]]}, protocol=4)))
    token = token_of(people["alice"])
    result = upload(path, live_site.url, token, project="alpha")
    status = wait_done(live_site, result["api_url"], token)
    assert status["status"] == "failed", status
    assert status["error"]["code"].startswith("snapshot:unsafe:")
    assert status["error"]["message"].startswith("This file asks to run code when loaded")
    assert not canary.exists()
    assert live_site.worker.poll() is None, "the worker stays up"


def test_the_cli_reports_the_sites_code_and_exits_1(live_site: Site, people: dict[str, Any]) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OOMSCOPE_")}
    env.update({"PYTHONPATH": str(ROOT / "client"), "OOMSCOPE_TOKEN": token_of(people["alice"])})
    argv = [sys.executable, "-m", "oomscope_client", "upload", str(GPT_OOM), "--url", live_site.url]
    refused_cli = subprocess.run([*argv, "--project", "beta"], capture_output=True, text=True, env=env, timeout=60)
    assert refused_cli.returncode == 1
    assert "HTTP 404: upload:unknown-project: No project 'beta' that you can upload to. " in refused_cli.stderr
    assert "Projects you can upload to: alpha, gamma" in refused_cli.stderr
    ok = subprocess.run([*argv, "--project", "alpha"], capture_output=True, text=True, env=env, timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["status"] == "queued"


def test_every_code_the_client_explains_is_one_the_site_answers() -> None:
    """No invented codes: each code (or family) in the client's table occurs in the site's source."""
    source = "\n".join(
        p.read_text() for p in [*(ROOT / "webapp" / "snapshots").rglob("*.py"), ROOT / "analysis" / "errors.py"]
    )
    for code in [*HINTS, *HINT_PREFIXES]:
        assert f'"{code}' in source, code


def test_the_cli_gives_a_cap_for_a_run_without_an_oom_and_prints_the_edge(
    live_site: Site, people: dict[str, Any]
) -> None:
    """`--cap 32GiB` on infer_varbatch (no OOM; its own reserved peak 31.44 GiB, truth file): the worker's report
    takes the cap as its limit (source given) and `--wait` prints the edge-of-cap finding."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OOMSCOPE_")}
    env.update({"PYTHONPATH": str(ROOT / "client"), "OOMSCOPE_TOKEN": token_of(people["alice"])})
    infer = FIXTURES / "infer_varbatch.pickle.gz"
    argv = [sys.executable, "-m", "oomscope_client", "upload", str(infer), "--url", live_site.url, "--project", "alpha"]
    refused = subprocess.run([*argv, "--cap", "7XB"], capture_output=True, text=True, env=env, timeout=60)
    assert refused.returncode == 1
    assert "HTTP 400: upload:invalid: cap: '7XB' is no size" in refused.stderr
    done = subprocess.run(
        [*argv, "--cap", "32GiB", "--wait", "--wait-timeout", "240"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert any(
        line.startswith(
            "At the edge of the cap: no OOM, but reserved memory peaked at 31.44 GiB, 98% of the cap of 32.00 GiB"
        )
        for line in lines
    ), lines
    assert "limit: 32.00 GiB (cap given)" in lines
