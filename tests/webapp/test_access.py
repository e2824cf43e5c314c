"""Who may reach what. The matrix is generated from the URLconf, so a new view cannot be skipped.

Every route in the ``snapshots`` and ``api`` namespaces is tried by an anonymous visitor
(pages: redirect to login; API: 401). Every route that names objects is tried by Bob
(team B) with **each** object of its URL in turn taken from Alice's team A and the rest his
own: compare's ``code_a`` and its ``code_b`` are each tried as another team's. Bob gets 404
(or the same 405 his own objects get), and the same URL with only his own objects is not a
404, so the 404 comes from the foreign object and not from a broken URL. API routes are
tried with Bob's token and with Bob's browser session. Routes outside those namespaces must
be in ``PUBLIC`` with a reason, or this test fails.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import URLPattern, URLResolver, get_resolver, reverse

from tests.webapp.helpers import bearer
from webapp.snapshots.intake import store
from webapp.snapshots.models import Report, Run, ShareLink, Upload
from webapp.snapshots.runs.runs import new_run_code
from webapp.snapshots.teams import membership, tokens

pytestmark = pytest.mark.django_db

# Routes reachable without a team membership, each for a reason.
PUBLIC = {
    "healthz": "load balancers probe it; it names no object",
    "login": "the way in",
    "logout": "ends a session; names no object",
    "signup": "the way in",
    "snapshots:home": "logged out, the front page says what the product is (issue 35); test_home_logged_out below",
    "snapshots:share_view": "the capability URL itself; test_share_links.py",
    "snapshots:share_status_json": "the capability URL's status poll; test_share_links.py",
    "admin": "Django admin has its own staff-only login; test_admin_refuses_non_staff below",
    "admin_login": "the admin's way in, rate-limited like the site's; test_hardening2.py",
    "snapshots:share_timeline_json": "the capability URL's zoom detail; tested in test_ux_explore",
    "snapshots:share_state_json": "the capability URL's state at an event; tested in test_ux_explore",
    "snapshots:share_block_json": "the capability URL's block stacks; tested in test_ux_explore",
    "snapshots:share_active_json": "the capability URL's active-memory bands; tested in test_ux_explore",
    "snapshots:share_charts_json": "the capability URL's later charts; tested in test_ux_explore",
    "snapshots:share_segments_json": "the capability URL's segment timeline; tested in test_ux_digging",
    "snapshots:share_events_json": "the capability URL's event list; tested in test_ux_memviz",
}

# What each URL keyword names; a route with a keyword missing here fails test_every_keyword_is_known.
UPLOAD_KEYS = {"code", "code_a", "code_b"}
PROJECT_KEYS = {"slug"}
TEAM_KEYS = {"team"}  # a team's slug (the team pages)
RUN_KEYS = {"run_code"}  # a run's public code (the run pages and API)


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
# (route, the one keyword whose object is another team's), for every keyword of every route.
FOREIGN_CASES = [(name, key) for name in OBJECT_ROUTES for key in sorted(dict(ROUTES)[name].pattern.converters)]
# ... each through every way in: pages by session; the API by token and by session.
FOREIGN_MATRIX = [
    (name, key, via)
    for name, key in FOREIGN_CASES
    for via in (("token", "session") if name[:4] == "api:" else ("session",))
]


def test_every_route_is_protected_or_listed_public() -> None:
    for name, _ in ROUTES:
        assert name in PUBLIC or name.split(":")[0] in {"snapshots", "api"}, f"{name}: not classified"
    # The matrix below really covers the pages and the API.
    assert {"snapshots:detail", "snapshots:history", "api:snapshot", "api:snapshot_report"} <= set(PROTECTED)
    # compare is tried twice, once per code: the case the security mutant hid in.
    assert ("snapshots:compare", "code_a") in FOREIGN_CASES and ("snapshots:compare", "code_b") in FOREIGN_CASES


def test_every_keyword_is_known() -> None:
    for name in OBJECT_ROUTES:
        for key in dict(ROUTES)[name].pattern.converters:
            assert key in UPLOAD_KEYS | PROJECT_KEYS | TEAM_KEYS | RUN_KEYS, (
                f"{name}: URL keyword {key!r} names an unknown kind"
            )


def url_for(name: str, owner: dict[str, str], foreign: dict[str, str] | None = None, key: str | None = None) -> str:
    """The route's URL with every object ``owner``'s, except ``key``'s, which is ``foreign``'s."""
    kwargs = {}
    for k in dict(ROUTES)[name].pattern.converters:
        source = foreign if (foreign is not None and k == key) else owner
        kwargs[k] = source["slug"] if k in PROJECT_KEYS else source["team"] if k in TEAM_KEYS else source[k]
    return reverse(name, kwargs=kwargs)


def team_objects(project: Any, user: Any) -> dict[str, str]:
    # Rows only: who may see a row does not depend on its file. Two uploads, so compare can
    # name two different ones; queued, so the report route answers "report-not-ready" to a
    # member and "not-found" to anyone else (the two 404s are told apart by their codes).
    a = Upload.objects.create(
        code=store.new_upload_code(), project=project, uploaded_by=user, filename=f"{project.slug}-a", bytes=1
    )
    b = Upload.objects.create(
        code=store.new_upload_code(), project=project, uploaded_by=user, filename=f"{project.slug}-b", bytes=1
    )
    run = Run.objects.create(code=new_run_code(), project=project, name=f"{project.slug}-run")
    return {
        "code": a.code,
        "code_a": a.code,
        "code_b": b.code,
        "slug": project.slug,
        "team": project.team.slug,
        "run_code": run.code,
    }


@pytest.fixture
def objects(alice: Any, alpha: Any) -> dict[str, str]:
    return team_objects(alpha, alice)


@pytest.fixture
def bobs(bob: Any, beta: Any) -> dict[str, str]:
    return team_objects(beta, bob)


def is_login_redirect(response: Any) -> bool:
    return response.status_code == 302 and response["Location"].startswith(reverse("login"))


@pytest.mark.parametrize("name", PROTECTED)
@pytest.mark.parametrize("method", ["get", "post", "delete"])
def test_anonymous_is_refused(client: Any, objects: dict[str, str], name: str, method: str) -> None:
    url = url_for(name, objects)
    response = getattr(client, method)(url)
    if name.startswith("api:"):
        assert response.status_code == 401, (url, response.status_code)
        assert response.json()["error"]["code"] == "auth-required"
    else:
        assert is_login_redirect(response), (url, response.status_code)


def test_home_logged_out_shows_the_product_and_nothing_of_a_team(client: Any, objects: dict[str, str]) -> None:
    page = client.get(reverse("snapshots:home"))
    assert page.status_code == 200 and "snapshots/welcome.html" in [t.name for t in page.templates]
    body = page.content.decode()
    assert "Why did your training job run out of GPU memory?" in body
    assert objects["code"] not in body and "Alpha" not in body and "Recent uploads" not in body
    assert client.post(reverse("snapshots:home")).status_code == 405


def _request(client: Any, method: str, url: str, via: str, token: str) -> Any:
    if via == "token":
        return getattr(client, method)(url, **bearer(token))
    return getattr(client, method)(url)


@pytest.mark.parametrize(("name", "key", "via"), FOREIGN_MATRIX)
@pytest.mark.parametrize("method", ["get", "post", "delete"])
def test_each_object_of_another_team_is_404(
    client: Any,
    objects: dict[str, str],
    bobs: dict[str, str],
    bob: Any,
    bob_token: str,
    name: str,
    key: str,
    method: str,
    via: str,
) -> None:
    if via == "session":
        client.force_login(bob)
    foreign_url = url_for(name, bobs, objects, key)
    own_url = url_for(name, bobs)
    shares_before = ShareLink.objects.count()
    foreign = _request(client, method, foreign_url, via, bob_token)
    own = _request(client, method, own_url, via, bob_token)
    assert own.status_code != 404 or own.json()["error"]["code"] == "report-not-ready", (own_url, own.status_code)
    if foreign.status_code == 405:  # a method the route does not take: the same answer as for his own
        assert own.status_code == 405, (own_url, own.status_code)
    else:
        assert foreign.status_code == 404, (foreign_url, foreign.status_code)
        if name.startswith("api:"):
            assert foreign.json()["error"]["code"] == "not-found"
    body = foreign.content.decode()
    for secret in (objects["code_a"], objects["code_b"], "alpha-a", "alpha-b", "Team A"):
        assert secret not in body, (foreign_url, secret)
    # Nothing was written for Alice's uploads by Bob's requests (a share link, say).
    alice_codes = [objects["code_a"], objects["code_b"]]
    assert not ShareLink.objects.filter(upload__code__in=alice_codes).exists()
    assert ShareLink.objects.count() - shares_before <= 1  # at most Bob's own request made one


def test_other_team_sees_nothing_of_alpha(client: Any, objects: dict[str, str], bob: Any, beta: Any) -> None:
    client.force_login(bob)
    for name in ("snapshots:home", "snapshots:upload"):
        body = client.get(reverse(name)).content.decode()
        assert objects["code"] not in body and "Alpha" not in body


def test_api_upload_into_another_teams_project_is_404(
    client: Any, objects: dict[str, str], bob_token: str, django_capture_on_commit_callbacks: Any
) -> None:
    from tests.webapp.helpers import GPT_OOM

    with open(GPT_OOM, "rb") as fh, django_capture_on_commit_callbacks() as published:
        response = client.post("/api/v1/snapshots", {"file": fh, "project": "alpha"}, **bearer(bob_token))
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "upload:unknown-project"
    assert Upload.objects.filter(project__slug="alpha").count() == 2 and not published


def test_page_upload_into_another_teams_project_is_refused(client: Any, bob: Any, beta: Any) -> None:
    from tests.webapp.helpers import GPT_OOM

    client.force_login(bob)
    with open(GPT_OOM, "rb") as fh:
        response = client.post("/upload/", {"file": fh, "project": "alpha"}, headers={"Accept": "application/json"})
    assert response.status_code == 400  # not among his choices
    assert response.json()["error"]["code"] == "upload:invalid"
    assert not Upload.objects.exists()


@pytest.mark.parametrize("name", PROTECTED)
def test_member_reaches_every_route(alice_client: Any, objects: dict[str, str], name: str) -> None:
    url = url_for(name, objects)
    response = alice_client.get(url)
    # 405 for POST-only routes; 404 only for a report that is not ready yet (the rows here have no report).
    explore = ("timeline", "state", "block", "active", "segments", "charts", "events")
    not_ready = {"api:snapshot_report"} | {f"snapshots:{k}_json" for k in explore}
    assert (
        response.status_code in (200, 405)
        or (name in not_ready and response.json()["error"]["code"] == "report-not-ready")
        or (name == "api:unknown" and response.json()["error"]["code"] == "not-found")  # the API's catch-all
        or (name == "api:site_advice" and response.json()["error"]["code"] == "forbidden")  # staff only (issue 33)
    ), (url, response.status_code)
    assert not is_login_redirect(response)


def test_leaving_the_team_ends_access_at_once(client: Any, alice: Any, objects: dict[str, str], bob: Any) -> None:
    from webapp.snapshots.models import Membership, Team

    team = Team.objects.get(slug="team-a")
    membership.membership_add(team=team, user=bob, role="member")
    token = tokens.api_token_create(bob)
    client.force_login(bob)
    assert client.get(f"/s/{objects['code']}/").status_code == 200
    assert client.get(f"/api/v1/snapshots/{objects['code']}", **bearer(token)).status_code == 200
    Membership.objects.filter(team=team, user=bob).delete()
    assert client.get(f"/s/{objects['code']}/").status_code == 404
    assert client.get(f"/api/v1/snapshots/{objects['code']}", **bearer(token)).status_code == 404


def test_report_rows_of_another_team_never_leak_through_compare(
    client: Any, objects: dict[str, str], bobs: dict[str, str], bob: Any
) -> None:
    """With finished reports on both sides, compare of Bob's report with Alice's is still 404 both ways."""
    for code in (objects["code_a"], bobs["code_a"]):
        upload = Upload.objects.get(code=code)
        Report.objects.create(upload=upload, data={"schema": "oomscope.report/1", "devices": []}, charts={})
        Upload.objects.filter(pk=upload.pk).update(status=Upload.Status.DONE)
    client.force_login(bob)
    assert client.get(f"/compare/{bobs['code_a']}/{objects['code_a']}/").status_code == 404
    assert client.get(f"/compare/{objects['code_a']}/{bobs['code_a']}/").status_code == 404
    assert client.get(f"/compare/{bobs['code_a']}/{bobs['code_b']}/").status_code == 200


# --- the Django admin -------------------------------------------------------------------------

ADMIN_PAGES = ["/admin/", "/admin/snapshots/upload/", "/admin/snapshots/apitoken/", "/admin/auth/user/"]


def test_admin_refuses_non_staff_users(client: Any, alice: Any, objects: dict[str, str]) -> None:
    for url in ADMIN_PAGES:
        anonymous = client.get(url)
        assert anonymous.status_code == 302 and anonymous["Location"].startswith("/admin/login/"), url
    client.force_login(alice)  # a signed-in team owner, not staff
    for url in ADMIN_PAGES:
        response = client.get(url)
        assert response.status_code == 302 and response["Location"].startswith("/admin/login/"), url
    client.logout()
    # Her right password does not open the admin either.
    login = client.post("/admin/login/", {"username": "alice", "password": "pw-alice-123", "next": "/admin/"})
    assert login.status_code == 200
    assert "for a staff account" in login.content.decode()
    assert client.get("/admin/").status_code == 302


def test_admin_staff_without_permissions_sees_no_model(client: Any, django_user_model: Any) -> None:
    staff = django_user_model.objects.create_user("ops", password="pw-ops-123", is_staff=True)
    client.force_login(staff)
    assert client.get("/admin/").status_code == 200  # the index, listing nothing
    for url in ADMIN_PAGES[1:]:
        assert client.get(url).status_code == 403, url


def test_admin_opens_for_a_superuser(client: Any, django_user_model: Any, objects: dict[str, str]) -> None:
    root = django_user_model.objects.create_superuser("root", password="pw-root-123")
    client.force_login(root)
    for url in ADMIN_PAGES:
        assert client.get(url).status_code == 200, url
    assert objects["code"] in client.get("/admin/snapshots/upload/").content.decode()
