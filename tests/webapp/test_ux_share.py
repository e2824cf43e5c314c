"""Share links through the API (issue 10, item 6): several named links, listed, each revocable;
the snapshot's ``share_url`` is never null while it is shared."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from tests.webapp.helpers import bearer, make_upload

pytestmark = pytest.mark.django_db


def test_api_and_page_agree_on_several_links(client: Any, alice: Any, alpha: Any, alice_token: str) -> None:
    upload = make_upload(alpha, alice)
    api = f"/api/v1/snapshots/{upload.code}"
    assert client.get(api, **bearer(alice_token)).json()["share_url"] is None

    made = client.post(f"{api}/share", {"name": "ticket ML-1"}, **bearer(alice_token))
    assert made.status_code == 201
    first = made.json()["share_url"]
    assert made.json()["link"]["name"] == "ticket ML-1" and made.json()["link"]["use_count"] == 0
    status = client.get(api, **bearer(alice_token)).json()
    assert status["shared"] is True and status["share_url"] == first  # shown again, not only once

    second = client.post(f"{api}/share", {"name": "slack"}, **bearer(alice_token)).json()["share_url"]
    assert second != first
    reader = Client()
    assert reader.get(first).status_code == 200 and reader.get(first).status_code == 200
    listed = client.get(f"{api}/share", **bearer(alice_token)).json()
    assert [(x["name"], x["active"], x["use_count"], x["url"]) for x in listed["links"]] == [
        ("slack", True, 0, second),
        ("ticket ML-1", True, 2, first),
    ]
    assert all(x["created_at"] and x["created_by"] == "alice" for x in listed["links"])
    assert listed["share_url"] == second

    # The page lists the same links, with the same URLs.
    client.force_login(alice)
    page = client.get(f"/s/{upload.code}/")
    assert [x["url"] for x in page.context["share_links"]] == [second, first]

    # Revoke one by key: it is gone, the other lives, share_url follows.
    key = listed["links"][1]["key"]
    gone = client.delete(f"{api}/share?key={key}", **bearer(alice_token))
    assert gone.status_code == 200 and gone.json() == {"share_url": second, "revoked": 1}
    assert reader.get(first).status_code == 404 and reader.get(second).status_code == 200
    assert client.get(api, **bearer(alice_token)).json()["share_url"] == second
    unknown = client.delete(f"{api}/share?key={key}", **bearer(alice_token))
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "share:unknown-link"

    # DELETE without a key revokes every live link (the old contract).
    assert client.delete(f"{api}/share", **bearer(alice_token)).json()["revoked"] == 1
    status = client.get(api, **bearer(alice_token)).json()
    assert status["shared"] is False and status["share_url"] is None
    assert reader.get(second).status_code == 404


def test_another_team_cannot_list_or_revoke(client: Any, alice: Any, alpha: Any, bob_token: str) -> None:
    from webapp.snapshots.teams import shares

    upload = make_upload(alpha, alice)
    token = shares.share_create(upload, alice, "mine")
    api = f"/api/v1/snapshots/{upload.code}/share"
    assert client.get(api, **bearer(bob_token)).status_code == 404
    assert client.delete(api, **bearer(bob_token)).status_code == 404
    assert Client().get(f"/r/{token}/").status_code == 200
