"""Who may reach what. The matrix is generated from the URLconf, so a new view cannot be skipped.

Every route in the ``snapshots`` and ``api`` namespaces is tried by an anonymous
visitor (pages: redirect to login; API: 401) and by a signed-in user of another team
(404 for anything that names an object). Routes outside those namespaces must be in
``PUBLIC`` with a reason, or this test fails.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import URLPattern, URLResolver, get_resolver, reverse

from tests.webapp.helpers import bearer
from webapp.snapshots.models import Upload
from webapp.snapshots.services import new_upload_code

pytestmark = pytest.mark.django_db

# Routes reachable without a team membership, each for a reason.
PUBLIC = {
    "healthz": "load balancers probe it; it names no object",
    "login": "the way in",
    "logout": "ends a session; names no object",
    "signup": "the way in",
    "snapshots:share_view": "the capability URL itself; tested in test_pages and test_api",
    "snapshots:share_status_json": "the capability URL's status poll; tested in test_pages",
    "snapshots:share_timeline_json": "the capability URL's zoom detail; tested in test_ux_explore",
    "snapshots:share_state_json": "the capability URL's state at an event; tested in test_ux_explore",
    "snapshots:share_block_json": "the capability URL's block stacks; tested in test_ux_explore",
    "snapshots:share_active_json": "the capability URL's active-memory bands; tested in test_ux_explore",
    "admin": "Django admin has its own staff-only login",
}


def walk(patterns: list[Any], namespace: str = "") -> list[tuple[str, URLPattern]]:
    found: list[tuple[str, URLPattern]] = []
    for entry in patterns:
        if isinstance(entry, URLResolver):
            if entry.app_name == "admin":
                found.append(("admin", entry))  # type: ignore[arg-type]
                continue
            inner = f"{namespace}{entry.namespace}:" if entry.namespace else namespace
            found.extend(walk(entry.url_patterns, inner))
        elif entry.name:
            found.append((f"{namespace}{entry.name}", entry))
    return found


ROUTES = walk(get_resolver().url_patterns)
PROTECTED = sorted(name for name, _ in ROUTES if name not in PUBLIC)
# Routes whose URL names an object (upload code, project slug): another team must get 404.
OBJECT_ROUTES = [name for name in PROTECTED if dict(ROUTES)[name].pattern.converters]


def test_every_route_is_protected_or_listed_public() -> None:
    for name, _ in ROUTES:
        assert name in PUBLIC or name.split(":")[0] in {"snapshots", "api"}, f"{name}: not classified"
    # The matrix below really covers the pages and the API.
    assert {"snapshots:detail", "snapshots:history", "api:snapshot", "api:snapshot_report"} <= set(PROTECTED)


def kwargs_for(name: str, objects: dict[str, str]) -> dict[str, str]:
    pattern = dict(ROUTES)[name]
    return {key: objects[key] for key in pattern.pattern.converters}


@pytest.fixture
def objects(alice: Any, alpha: Any) -> dict[str, str]:
    # Rows only: who may see a row does not depend on its file.
    a = Upload.objects.create(code=new_upload_code(), project=alpha, uploaded_by=alice, filename="a", bytes=1)
    b = Upload.objects.create(code=new_upload_code(), project=alpha, uploaded_by=alice, filename="b", bytes=1)
    return {"code": a.code, "code_a": a.code, "code_b": b.code, "slug": alpha.slug, "team": alpha.team.slug}


def is_login_redirect(response: Any) -> bool:
    return response.status_code == 302 and response["Location"].startswith(reverse("login"))


@pytest.mark.parametrize("name", PROTECTED)
@pytest.mark.parametrize("method", ["get", "post", "delete"])
def test_anonymous_is_refused(client: Any, objects: dict[str, str], name: str, method: str) -> None:
    url = reverse(name, kwargs=kwargs_for(name, objects))
    response = getattr(client, method)(url)
    if name.startswith("api:"):
        assert response.status_code == 401, (url, response.status_code)
    else:
        assert is_login_redirect(response), (url, response.status_code)


@pytest.mark.parametrize("name", OBJECT_ROUTES)
@pytest.mark.parametrize("method", ["get", "post", "delete"])
def test_other_team_gets_404(
    client: Any, objects: dict[str, str], bob: Any, beta: Any, bob_token: str, name: str, method: str
) -> None:
    url = reverse(name, kwargs=kwargs_for(name, objects))
    if name.startswith("api:"):
        response = getattr(client, method)(url, **bearer(bob_token))
        assert response.status_code in (404, 405), (url, response.status_code)
        if response.status_code == 405:  # a method the route does not take: still nothing shown
            assert objects["code"] not in response.content.decode()
    else:
        client.force_login(bob)
        response = getattr(client, method)(url)
        assert response.status_code in (404, 405), (url, response.status_code)


def test_other_team_sees_nothing_of_alpha(client: Any, objects: dict[str, str], bob: Any, beta: Any) -> None:
    client.force_login(bob)
    for name in ("snapshots:home", "snapshots:upload"):
        body = client.get(reverse(name)).content.decode()
        assert objects["code"] not in body and "Alpha" not in body


@pytest.mark.parametrize("name", PROTECTED)
def test_member_reaches_every_route(alice_client: Any, objects: dict[str, str], name: str) -> None:
    url = reverse(name, kwargs=kwargs_for(name, objects))
    response = alice_client.get(url)
    # 405 for POST-only routes; 404 only for a report that is not ready yet (the rows here have no report).
    not_ready = {"api:snapshot_report"} | {f"snapshots:{k}_json" for k in ("timeline", "state", "block", "active")}
    assert response.status_code in (200, 405) or (name in not_ready and response.status_code == 404)
    if response.status_code == 404:
        assert response.json()["error"]["code"] == "report-not-ready"
    assert not is_login_redirect(response)
