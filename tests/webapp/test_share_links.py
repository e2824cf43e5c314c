"""Share links are scoped to one report, end when revoked, and count their uses.

Two uploads of Alice's, A (queued) and B (failed), so the two are told apart by what a page
shows: A's link shows A's filename and status and never B's; it opens nothing else (not B's
page, not the API, not the project); a revoked link is 404 on both its URLs; every view of
the page counts one use and sets ``last_used_at``, while the status poll and refused
requests count none.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from tests.webapp.helpers import bearer
from webapp.snapshots.intake import store
from webapp.snapshots.models import ShareLink, Upload
from webapp.snapshots.teams import shares, tokens

pytestmark = pytest.mark.django_db


@pytest.fixture
def pair(alice: Any, alpha: Any) -> tuple[Upload, Upload]:
    a = Upload.objects.create(
        code=store.new_upload_code(), project=alpha, uploaded_by=alice, filename="report-A.pickle", bytes=1
    )
    b = Upload.objects.create(
        code=store.new_upload_code(),
        project=alpha,
        uploaded_by=alice,
        filename="report-B.pickle",
        bytes=1,
        status=Upload.Status.FAILED,
        error_code="snapshot:format:empty",
        error_message="The file is empty.",
    )
    return a, b


def link(upload: Upload) -> ShareLink:
    return ShareLink.objects.get(upload=upload, revoked_at__isnull=True)


def test_a_link_opens_its_own_report_only(client: Any, alice: Any, pair: tuple[Upload, Upload]) -> None:
    a, b = pair
    token_a, token_b = shares.share_create(a, alice), shares.share_create(b, alice)
    page_a = client.get(reverse("snapshots:share_view", args=[token_a]))
    assert page_a.status_code == 200
    assert page_a.context["upload"]["code"] == a.code and page_a.context["shared"] is True
    body = page_a.content.decode()
    assert "report-A.pickle" in body and "report-B.pickle" not in body and b.code not in body
    assert client.get(reverse("snapshots:share_status_json", args=[token_a])).json()["status"] == "queued"
    assert client.get(reverse("snapshots:share_status_json", args=[token_b])).json()["status"] == "failed"
    assert client.get(reverse("snapshots:share_view", args=[token_b])).context["upload"]["code"] == b.code

    # The link is no key to anything else: B's member page, the API, the history.
    for url in (f"/s/{b.code}/", f"/s/{a.code}/", "/p/alpha/", f"/compare/{a.code}/{b.code}/"):
        response = client.get(url)
        assert response.status_code == 302 and response["Location"].startswith("/accounts/login/"), url
    for url in (f"/api/v1/snapshots/{a.code}", f"/api/v1/snapshots/{b.code}/report"):
        assert client.get(url, **bearer(token_a)).status_code == 401, url
    # A share token is no path to another: a token one character off is 404.
    off = token_a[:-1] + ("A" if token_a[-1] != "A" else "B")
    assert client.get(reverse("snapshots:share_view", args=[off])).status_code == 404


def test_a_revoked_link_is_404_on_both_urls_and_counts_nothing(
    client: Any, alice: Any, pair: tuple[Upload, Upload]
) -> None:
    a, b = pair
    token_a, token_b = shares.share_create(a, alice), shares.share_create(b, alice)
    assert client.get(reverse("snapshots:share_view", args=[token_a])).status_code == 200
    row = link(a)
    assert shares.share_revoke(a) == 1
    for name in ("snapshots:share_view", "snapshots:share_status_json"):
        gone = client.get(reverse(name, args=[token_a]))
        assert gone.status_code == 404, name
        assert gone["Cache-Control"] == "private, no-store" and gone["Referrer-Policy"] == "no-referrer"
    row.refresh_from_db()
    assert row.revoked_at is not None and row.use_count == 1  # the view before revocation only
    # Revoking A's link leaves B's.
    assert client.get(reverse("snapshots:share_view", args=[token_b])).status_code == 200


def test_use_counting(client: Any, alice: Any, pair: tuple[Upload, Upload]) -> None:
    a, b = pair
    token_a, token_b = shares.share_create(a, alice), shares.share_create(b, alice)
    assert (link(a).use_count, link(a).last_used_at) == (0, None)
    for _ in range(3):
        assert client.get(reverse("snapshots:share_view", args=[token_a])).status_code == 200
    for _ in range(2):  # the status page's poll is not a use
        client.get(reverse("snapshots:share_status_json", args=[token_a]))
    client.get(reverse("snapshots:share_view", args=[token_b]))
    client.get(reverse("snapshots:share_view", args=["not-a-token"]))
    assert link(a).use_count == 3 and link(a).last_used_at is not None
    assert link(b).use_count == 1
    assert sum(ShareLink.objects.values_list("use_count", flat=True)) == 4


def test_a_link_to_another_teams_report_works_for_anyone_holding_it(
    client: Any, alice: Any, bob: Any, beta: Any, pair: tuple[Upload, Upload]
) -> None:
    """The capability is the token: Bob (team B) reads A through it, read-only, and still not A's member page."""
    a, _ = pair
    token = shares.share_create(a, alice)
    client.force_login(bob)
    page = client.get(reverse("snapshots:share_view", args=[token]))
    assert page.status_code == 200 and page.context["shared"] is True
    assert f'action="/s/{a.code}/share/"' not in page.content.decode()  # no share or revoke form
    assert client.get(f"/s/{a.code}/").status_code == 404
    assert client.post(f"/s/{a.code}/share/", {"action": "revoke"}).status_code == 404
    assert link(a).revoked_at is None


def test_only_the_hash_is_stored(alice: Any, pair: tuple[Upload, Upload]) -> None:
    a, _ = pair
    token = shares.share_create(a, alice)
    row = link(a)
    assert len(token) >= 43  # secrets.token_urlsafe(32): 32 random bytes
    assert row.token_hash == tokens.token_hash(token) and row.prefix == token[:6]
    assert not ShareLink.objects.filter(token_hash=token).exists()
    assert shares.upload_for_share_token(row.token_hash) is None  # the hash does not open it
