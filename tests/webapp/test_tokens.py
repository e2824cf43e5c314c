"""API tokens: only a live token of an active user authenticates; sessions of inactive users end.

Live means: known (its sha256 is stored), not revoked, not past ``expires_at``. Anything else
is 401 ``auth-invalid-token`` (a missing header stays 401 ``auth-required``), on every API
route, and nothing is written (no upload, no share link, no ``last_used_at``).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from tests.webapp.helpers import GPT_OOM, bearer
from webapp.snapshots.intake import store
from webapp.snapshots.models import ApiToken, ShareLink, Upload
from webapp.snapshots.teams import tokens

pytestmark = pytest.mark.django_db


@pytest.fixture
def upload(alice: Any, alpha: Any) -> Upload:
    return Upload.objects.create(code=store.new_upload_code(), project=alpha, uploaded_by=alice, filename="a", bytes=1)


def calls(code: str) -> list[tuple[str, str]]:
    return [
        ("get", f"/api/v1/snapshots/{code}"),
        ("get", f"/api/v1/snapshots/{code}/report"),
        ("get", "/api/v1/projects/alpha/runs"),
        ("post", f"/api/v1/snapshots/{code}/share"),
        ("delete", f"/api/v1/snapshots/{code}/share"),
        ("post", "/api/v1/snapshots"),
    ]


def make_token(alice: Any, alpha: Any, state: str) -> str:
    now = timezone.now()
    if state == "unknown":
        return tokens.API_TOKEN_PREFIX + "x" * 43
    token = tokens.api_token_create(
        alice,
        default_project=alpha,
        expires_at={"expired": now - timedelta(seconds=1), "expires-later": now + timedelta(days=1)}.get(state),
    )
    row = ApiToken.objects.get(token_hash=tokens.token_hash(token))
    if state == "revoked":
        row.revoked_at = now
        row.save()
    if state == "inactive-user":
        alice.is_active = False
        alice.save()
    return token


@pytest.mark.parametrize("state", ["unknown", "revoked", "expired", "inactive-user"])
def test_dead_tokens_get_401_on_every_route(client: Any, alice: Any, alpha: Any, upload: Upload, state: str) -> None:
    token = make_token(alice, alpha, state)
    for method, url in calls(upload.code):
        if url == "/api/v1/snapshots":
            with open(GPT_OOM, "rb") as fh:
                response = client.post(url, {"file": fh}, **bearer(token))
        else:
            response = getattr(client, method)(url, **bearer(token))
        assert response.status_code == 401, (state, method, url, response.status_code)
        assert response.json()["error"]["code"] == "auth-invalid-token"
        assert "revoked or expired" in response.json()["error"]["message"]
        assert response["WWW-Authenticate"] == 'Bearer realm="oomscope"'
    assert Upload.objects.count() == 1 and not ShareLink.objects.exists()
    assert not ApiToken.objects.filter(last_used_at__isnull=False).exists()


@pytest.mark.parametrize("state", ["never-expires", "expires-later"])
def test_live_tokens_work_and_record_their_use(client: Any, alice: Any, alpha: Any, upload: Upload, state: str) -> None:
    token = make_token(alice, alpha, state)
    response = client.get(f"/api/v1/snapshots/{upload.code}", **bearer(token))
    assert response.status_code == 200 and response.json()["id"] == upload.code
    assert ApiToken.objects.get(token_hash=tokens.token_hash(token)).last_used_at is not None


def test_a_token_expires_at_its_time(alice: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """``expires_at`` is exclusive: a microsecond before, the token works; at that instant it is dead."""
    expires = timezone.now() + timedelta(hours=1)
    token = tokens.api_token_create(alice, expires_at=expires)
    monkeypatch.setattr(tokens.timezone, "now", lambda: expires - timedelta(microseconds=1))
    assert tokens.api_token_user(token) is not None
    monkeypatch.setattr(tokens.timezone, "now", lambda: expires)
    assert tokens.api_token_user(token) is None


def test_revoking_one_token_leaves_the_others(client: Any, alice: Any, alpha: Any, upload: Upload) -> None:
    first, second = tokens.api_token_create(alice), tokens.api_token_create(alice)
    ApiToken.objects.filter(token_hash=tokens.token_hash(first)).update(revoked_at=timezone.now())
    url = f"/api/v1/snapshots/{upload.code}"
    assert client.get(url, **bearer(first)).status_code == 401
    assert client.get(url, **bearer(second)).status_code == 200


@pytest.mark.parametrize("header", ["Bearer", "Bearer ", "Basic YWxpY2U6cHc=", "Token oom_x", "bearer-oom_x", "oom_x"])
def test_malformed_authorization_is_401(client: Any, upload: Upload, header: str) -> None:
    response = client.get(f"/api/v1/snapshots/{upload.code}", HTTP_AUTHORIZATION=header)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "auth-invalid-token"


def test_the_token_is_stored_only_as_its_hash(alice: Any) -> None:
    token = tokens.api_token_create(alice)
    row = ApiToken.objects.get()
    assert token.startswith(tokens.API_TOKEN_PREFIX) and len(token) >= len(tokens.API_TOKEN_PREFIX) + 43
    assert row.token_hash == tokens.token_hash(token) != token and row.prefix == token[:10]
    assert tokens.api_token_user(token) == (alice, row)
    assert tokens.api_token_user(row.token_hash) is None  # the stored hash is not a token


def test_a_bad_token_is_not_rescued_by_a_session(client: Any, alice: Any, alpha: Any, upload: Upload) -> None:
    """A request that sends a token is judged by the token alone, even with a valid session cookie."""
    client.force_login(alice)
    response = client.get(f"/api/v1/snapshots/{upload.code}", **bearer("oom_not-a-token"))
    assert response.status_code == 401


def test_an_inactive_users_session_ends(client: Any, alice: Any, alpha: Any, upload: Upload) -> None:
    client.force_login(alice)
    assert client.get(f"/s/{upload.code}/").status_code == 200
    assert client.get(f"/api/v1/snapshots/{upload.code}").status_code == 200
    alice.is_active = False
    alice.save()
    page = client.get(f"/s/{upload.code}/")
    assert page.status_code == 302 and page["Location"].startswith("/accounts/login/")
    assert client.get(f"/api/v1/snapshots/{upload.code}").status_code == 401
    # and she cannot sign in again
    client.logout()
    login = client.post("/accounts/login/", {"username": "alice", "password": "pw-alice-123"})
    assert login.status_code == 200 and "_auth_user_id" not in client.session


def test_create_api_token_command_makes_a_live_token(alice: Any, alpha: Any, upload: Upload, client: Any) -> None:
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    call_command("create_api_token", "alice", stdout=out)
    token = out.getvalue().strip().splitlines()[-1].strip()
    assert client.get(f"/api/v1/snapshots/{upload.code}", **bearer(token)).status_code == 200


def test_create_api_token_days_sets_the_expiry(alice: Any) -> None:
    from io import StringIO

    from django.core.management import CommandError, call_command

    before = timezone.now()
    call_command("create_api_token", "alice", "--days", "2", stdout=StringIO())
    expires = ApiToken.objects.get().expires_at
    assert before + timedelta(days=2) <= expires <= timezone.now() + timedelta(days=2)
    with pytest.raises(CommandError, match="--days must be positive"):
        call_command("create_api_token", "alice", "--days", "0", stdout=StringIO())
