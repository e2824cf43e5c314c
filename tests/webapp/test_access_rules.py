"""The rules behind access and uploads, one by one, at their edges.

the lookups of ``teams/`` (membership, share links, API tokens), the upload caps (the declared
length, the streamed bytes, exactly at the cap and one byte over) and the field limits (run,
tags, note). Each test names the figure it expects and why; they are written to fail when a
comparison or a filter of the rule changes (see docs/testing.md, mutation testing).
"""

from __future__ import annotations

import hashlib
import io
from datetime import timedelta
from typing import Any
from unittest import mock

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import OperationalError
from django.db.models import QuerySet
from django.test import RequestFactory
from django.utils import timezone

from tests.webapp.helpers import bearer, make_upload
from webapp.snapshots.intake.forms import UploadForm, split_tags
from webapp.snapshots.intake.intake import content_length_over_cap, is_too_large
from webapp.snapshots.intake.uploads import MULTIPART_OVERHEAD, SNIFF_BYTES, CappedHashingUploadHandler
from webapp.snapshots.models import ApiToken, Membership, ShareLink, Upload
from webapp.snapshots.teams import access, membership, shares, tokens

pytestmark = pytest.mark.django_db


# --------------------------------------------------------------------------- membership


def test_anonymous_sees_no_project_and_no_upload(alice: Any, alpha: Any) -> None:
    from django.contrib.auth.models import AnonymousUser

    make_upload(alpha, alice)
    anon = AnonymousUser()
    assert list(access.visible_projects(anon)) == []
    assert list(access.visible_uploads(anon)) == []
    assert access.project_for_user(anon, "alpha") is None


def test_a_user_sees_exactly_the_projects_and_uploads_of_their_teams(
    alice: Any, bob: Any, alpha: Any, beta: Any
) -> None:
    mine = make_upload(alpha, alice)
    theirs = make_upload(beta, bob)
    assert [p.slug for p in access.visible_projects(alice)] == ["alpha"]
    assert [u.code for u in access.visible_uploads(alice)] == [mine.code]
    assert access.upload_for_user(alice, mine.code) == mine
    assert access.upload_for_user(alice, theirs.code) is None  # another team's code: not found
    assert access.project_for_user(alice, "alpha") == alpha
    assert access.project_for_user(alice, "beta") is None
    # Joining team B (as a plain member) makes its project and uploads visible; nothing else changes.
    membership.membership_add(team=beta.team, user=alice, role=Membership.Role.MEMBER)
    assert sorted(p.slug for p in access.visible_projects(alice)) == ["alpha", "beta"]
    assert access.upload_for_user(alice, theirs.code) == theirs
    assert access.project_for_user(alice, "beta") == beta
    assert [u.code for u in access.visible_uploads(bob)] == [theirs.code]


def test_compare_refuses_a_second_snapshot_of_another_team(
    alice_client: Any, alice: Any, bob: Any, alpha: Any, beta: Any
) -> None:
    # The first code is Alice's; the second is Bob's: the page must answer 404, not show Bob's.
    mine, other = make_upload(alpha, alice), make_upload(beta, bob)
    assert alice_client.get(f"/compare/{mine.code}/{other.code}/").status_code == 404
    assert alice_client.get(f"/compare/{other.code}/{mine.code}/").status_code == 404
    assert alice_client.get(f"/compare/{mine.code}/{mine.code}/").status_code == 200


def test_lists_read_their_project_and_team_in_one_query(alice: Any, alpha: Any, django_assert_num_queries: Any) -> None:
    # The home page and the API list uploads with their project and team, and projects with their team:
    # each list is one query, not one more per row (two uploads here).
    make_upload(alpha, alice)
    make_upload(alpha, alice)
    with django_assert_num_queries(1):
        assert [(u.project.slug, u.project.team.pk) for u in access.visible_uploads(alice)] == [
            ("alpha", alpha.team.pk)
        ] * 2
    with django_assert_num_queries(1):
        assert [(p.slug, p.team.pk) for p in access.visible_projects(alice)] == [("alpha", alpha.team.pk)]


def test_a_share_link_reads_its_upload_project_and_team_in_one_query(
    alice: Any, alpha: Any, django_assert_num_queries: Any
) -> None:
    # A status poll (count_use=False: no UPDATE) is the link's one lookup, its upload's project and
    # team with it.
    upload = make_upload(alpha, alice)
    token = shares.share_create(upload, alice)
    with django_assert_num_queries(1):
        found = shares.upload_for_share_token(token, count_use=False)
        assert found is not None
        assert (found.code, found.project.slug, found.project.team.pk) == (upload.code, "alpha", alpha.team.pk)


# --------------------------------------------------------------------------- share links


def test_share_link_counts_each_use_and_dies_when_revoked(alice: Any, alpha: Any) -> None:
    upload = make_upload(alpha, alice)
    token = shares.share_create(upload, alice)
    link = ShareLink.objects.get(upload=upload)
    assert shares.share_active(upload) == link
    assert shares.upload_for_share_token(token) == upload
    assert shares.upload_for_share_token(token) == upload
    link.refresh_from_db()
    assert link.use_count == 2  # two uses, one each
    assert link.last_used_at is not None
    # A status poll does not count as a use.
    assert shares.upload_for_share_token(token, count_use=False) == upload
    link.refresh_from_db()
    assert link.use_count == 2
    assert shares.upload_for_share_token("not-" + token) is None
    # Revoking answers how many live links went (1), and the token is dead from then on.
    assert shares.share_revoke(upload) == 1
    assert shares.share_revoke(upload) == 0
    assert shares.upload_for_share_token(token) is None
    assert shares.share_active(upload) is None


def test_a_new_share_link_leaves_the_old_one_and_each_is_revoked_alone(alice: Any, alpha: Any) -> None:
    # Several named links per report (issue 10): a second link does not kill the first; revoking one by
    # its key leaves the other live.
    upload = make_upload(alpha, alice)
    first = shares.share_create(upload, alice)
    second = shares.share_create(upload, alice)
    assert shares.upload_for_share_token(first) == upload
    assert shares.upload_for_share_token(second) == upload
    live = ShareLink.objects.filter(upload=upload, revoked_at__isnull=True)
    assert live.count() == 2
    oldest = live.order_by("created_at", "id").first()
    assert oldest is not None
    assert shares.share_revoke(upload, oldest.key) == 1
    assert shares.upload_for_share_token(first) is None
    assert shares.upload_for_share_token(second) == upload


def test_a_share_link_reaches_only_its_own_upload(alice: Any, alpha: Any) -> None:
    one, two = make_upload(alpha, alice), make_upload(alpha, alice)
    token = shares.share_create(one, alice)
    assert shares.upload_for_share_token(token) == one
    assert shares.share_active(two) is None


def test_revoking_one_upload_links_leaves_every_other_upload_links_live(alice: Any, alpha: Any) -> None:
    # share_revoke works on its own upload's links only: revoking all of one's (1 link) or one key of
    # another upload's through it (0 links: the key is not this upload's) leaves the other link live.
    one, two = make_upload(alpha, alice), make_upload(alpha, alice)
    token_one, token_two = shares.share_create(one, alice), shares.share_create(two, alice)
    key_two = ShareLink.objects.get(upload=two).key
    assert shares.share_revoke(one, key_two) == 0
    assert shares.upload_for_share_token(token_two) == two
    assert shares.share_revoke(one) == 1
    assert shares.upload_for_share_token(token_one) is None
    assert shares.upload_for_share_token(token_two) == two
    assert shares.share_active(two) == ShareLink.objects.get(upload=two)


def test_the_active_link_is_the_newest_by_creation_time(alice: Any, alpha: Any) -> None:
    # "The newest live link" is the one created last, as the page's list orders them (created_at, then
    # id): a link whose row id is lower but whose creation time is later (a clock set back between the
    # two, here written by hand) is the newest, and share_links lists it first.
    upload = make_upload(alpha, alice)
    shares.share_create(upload, alice, name="first row")
    shares.share_create(upload, alice, name="second row")
    first, second = ShareLink.objects.filter(upload=upload).order_by("id")
    ShareLink.objects.filter(pk=first.pk).update(created_at=second.created_at + timedelta(seconds=1))
    assert shares.share_active(upload) == first
    assert shares.share_links(upload, None)[0]["key"] == first.key
    # Made in the same instant (the same created_at, to the microsecond), the later row is the newer.
    ShareLink.objects.filter(pk=first.pk).update(created_at=second.created_at)
    assert shares.share_active(upload) == second
    assert shares.share_links(upload, None)[0]["key"] == second.key


# --------------------------------------------------------------------------- API tokens


def test_api_token_live_revoked_and_inactive_user(alice: Any, alpha: Any) -> None:
    raw = tokens.api_token_create(alice, default_project=alpha)
    found = tokens.api_token_user(raw)
    assert found is not None
    user, token = found
    assert user == alice and token.default_project == alpha
    token.refresh_from_db()
    assert token.last_used_at is not None
    assert tokens.api_token_user(raw + "x") is None
    # An inactive user's token stops working, and works again once the user is active.
    alice.is_active = False
    alice.save()
    assert tokens.api_token_user(raw) is None
    alice.is_active = True
    alice.save()
    assert tokens.api_token_user(raw) is not None
    # A revoked token is dead.
    ApiToken.objects.filter(pk=token.pk).update(revoked_at=timezone.now() - timedelta(seconds=1))
    assert tokens.api_token_user(raw) is None


def test_api_refuses_revoked_tokens_and_inactive_users(client: Any, alice: Any, alpha: Any) -> None:
    raw = tokens.api_token_create(alice, default_project=alpha)
    upload = make_upload(alpha, alice)
    assert client.get(f"/api/v1/snapshots/{upload.code}", **bearer(raw)).status_code == 200
    alice.is_active = False
    alice.save()
    assert client.get(f"/api/v1/snapshots/{upload.code}", **bearer(raw)).status_code == 401
    alice.is_active = True
    alice.save()
    ApiToken.objects.update(revoked_at=timezone.now())
    assert client.get(f"/api/v1/snapshots/{upload.code}", **bearer(raw)).status_code == 401


def test_api_token_use_is_written_at_most_once_a_minute(alice: Any, alpha: Any) -> None:
    # USAGE_WRITE_INTERVAL is 1 minute: a use exactly 60 s after the recorded one writes nothing, one
    # 1 microsecond later writes the new time.
    raw = tokens.api_token_create(alice, default_project=alpha)
    t0 = timezone.now()
    ApiToken.objects.update(last_used_at=t0)
    for now, recorded in ((t0 + timedelta(minutes=1), t0), (t0 + timedelta(minutes=1, microseconds=1), None)):
        with mock.patch("django.utils.timezone.now", return_value=now):
            assert tokens.api_token_user(raw) is not None
        assert ApiToken.objects.get().last_used_at == (recorded or now)


def test_api_token_reads_its_projects_and_user_in_its_one_query(
    alice: Any, alpha: Any, django_assert_num_queries: Any
) -> None:
    # Every API call reads the token's user, its default project and its project: they come with the
    # lookup, not one query each (the use was just written, so no UPDATE either: 1 query).
    raw = tokens.api_token_create(alice, project=alpha)
    assert tokens.api_token_user(raw) is not None
    with django_assert_num_queries(1):
        found = tokens.api_token_user(raw)
        assert found is not None
        user, token = found
        assert (user, token.user, token.default_project, token.project) == (alice, alice, alpha, alpha)


def test_api_token_use_not_written_is_logged_with_the_token_prefix(
    alice: Any, alpha: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # A locked database skips the last-use write (best effort) and logs which token it was.
    raw = tokens.api_token_create(alice, default_project=alpha)
    locked = OperationalError("database is locked")
    with mock.patch.object(QuerySet, "update", side_effect=locked), caplog.at_level("WARNING"):
        assert tokens.api_token_user(raw) is not None
    assert [r.getMessage() for r in caplog.records if r.name == tokens.log.name] == [
        f"api token {raw[:10]}: last use not recorded: database is locked"
    ]


# --------------------------------------------------------------------------- upload caps

CAP = 200 * 1024  # bytes; several 64 KiB chunks of Django's upload handlers


@pytest.fixture
def cap(settings: Any) -> int:
    settings.UPLOAD_MAX_BYTES = CAP
    return CAP


def pickle_bytes(size: int) -> bytes:
    """A file that sniffs as a pickle (protocol 4 header), of exactly ``size`` bytes."""
    return b"\x80\x04" + (bytes(range(256)) * (size // 256 + 1))[: size - 2]


def test_pickle_bytes_has_the_size_asked() -> None:
    assert len(pickle_bytes(CAP)) == CAP == 204_800


def test_declared_length_at_and_over_the_cap(cap: int) -> None:
    rf = RequestFactory()
    at = rf.post("/", CONTENT_LENGTH=str(cap + MULTIPART_OVERHEAD))
    over = rf.post("/", CONTENT_LENGTH=str(cap + MULTIPART_OVERHEAD + 1))
    assert content_length_over_cap(at) is False  # exactly cap + the multipart allowance: allowed
    assert content_length_over_cap(over) is True
    assert content_length_over_cap(rf.post("/", CONTENT_LENGTH="twelve")) is False  # unreadable: let the parser decide
    assert content_length_over_cap(rf.get("/")) is False


def test_handler_refuses_a_declared_body_over_the_cap_before_reading(cap: int) -> None:
    request = RequestFactory().post("/")
    handler = CappedHashingUploadHandler(request)
    assert handler.handle_raw_input(io.BytesIO(), {}, cap + MULTIPART_OVERHEAD, b"x") is None
    assert not is_too_large(request)
    result = handler.handle_raw_input(io.BytesIO(), {}, cap + MULTIPART_OVERHEAD + 1, b"x")
    assert result is not None
    post, files = result
    assert len(post) == 0 and len(files) == 0
    assert is_too_large(request)


def stream(handler: CappedHashingUploadHandler, data: bytes, chunk: int = 64 * 1024) -> Any:
    handler.new_file("file", "x.pickle", "application/octet-stream", len(data))
    for start in range(0, len(data), chunk):
        handler.receive_data_chunk(data[start : start + chunk], start)
    return handler.file_complete(len(data))


def test_handler_keeps_a_file_of_exactly_the_cap_with_its_hash_and_head(cap: int) -> None:
    from django.core.files.uploadhandler import StopUpload

    data = pickle_bytes(cap)
    request = RequestFactory().post("/")
    uploaded = stream(CappedHashingUploadHandler(request), data)
    assert not is_too_large(request)
    assert uploaded.size == cap
    assert uploaded.sha256 == hashlib.sha256(data).hexdigest()
    assert uploaded.head == data[:SNIFF_BYTES]  # the first 4,096 bytes, for sniffing
    uploaded.seek(0)
    assert uploaded.read() == data
    # One byte more is over the cap: the stream stops and the request is marked.
    request = RequestFactory().post("/")
    with pytest.raises(StopUpload):
        stream(CappedHashingUploadHandler(request), data + b"\x00")
    assert is_too_large(request)


def test_api_accepts_a_file_of_exactly_the_cap_and_refuses_one_byte_more(
    client: Any, alice_token: str, cap: int
) -> None:
    data = pickle_bytes(cap)
    ok = client.post("/api/v1/snapshots", {"file": SimpleUploadedFile("x.pickle", data)}, **bearer(alice_token))
    assert ok.status_code == 202, ok.content
    upload = Upload.objects.get()
    assert upload.bytes == cap
    assert upload.sha256 == hashlib.sha256(data).hexdigest()
    over = client.post(
        "/api/v1/snapshots", {"file": SimpleUploadedFile("y.pickle", data + b"\x00")}, **bearer(alice_token)
    )
    assert over.status_code == 413
    assert over.json()["error"]["code"] == "upload:too-large"
    assert Upload.objects.count() == 1


# --------------------------------------------------------------------------- run, tags, note


def test_split_tags() -> None:
    assert split_tags("a, b;c,, ;") == ["a", "b", "c"]
    assert split_tags("") == []
    assert split_tags("x" * 60) == ["x" * 50]  # a tag keeps its first 50 characters


def form(**fields: str) -> UploadForm:
    files = {"file": SimpleUploadedFile("x.pickle", b"\x80\x04.")}
    return UploadForm({"project": "alpha", **fields}, files, project_choices=[("alpha", "Alpha")])


def test_page_form_limits_at_and_over() -> None:
    assert form(run="r" * 200, tags="t" * 500, note="n" * 5000).is_valid()
    assert set(form(run="r" * 201).errors) == {"run"}
    assert set(form(tags="t" * 501).errors) == {"tags"}
    assert set(form(note="n" * 5001).errors) == {"note"}
    ok = form(tags="gpu, nightly;  a100")
    assert ok.is_valid()
    assert ok.cleaned_data["tags"] == ["gpu", "nightly", "a100"]


def test_page_form_preselects_the_only_project() -> None:
    one = UploadForm(project_choices=[("alpha", "Alpha")])
    assert one.fields["project"].initial == "alpha"
    two = UploadForm(project_choices=[("alpha", "Alpha"), ("beta", "Beta")])
    assert two.fields["project"].initial is None
    assert list(two.fields["project"].choices) == [("alpha", "Alpha"), ("beta", "Beta")]  # type: ignore[attr-defined]


def test_api_fields_are_capped(client: Any, alice_token: str) -> None:
    data = pickle_bytes(4096)
    tags = ",".join(f"t{i}" for i in range(25)) + "," + "y" * 70
    # Over its limit a field is refused, as on the page form (one definition: forms.UploadFieldsForm) ...
    over = client.post(
        "/api/v1/snapshots",
        {"file": SimpleUploadedFile("x.pickle", data), "run": "r" * 201, "tags": tags, "note": "hello"},
        **bearer(alice_token),
    )
    assert over.status_code == 400 and over.json()["error"]["code"] == "upload:invalid"
    assert not Upload.objects.exists()
    # ... at it, accepted once stripped; the tags are cut to the first 20, each to 50 characters.
    response = client.post(
        "/api/v1/snapshots",
        {"file": SimpleUploadedFile("x.pickle", data), "run": "  " + "r" * 200 + " ", "tags": tags, "note": "hello"},
        **bearer(alice_token),
    )
    assert response.status_code == 202, response.content
    upload = Upload.objects.get()
    assert upload.run == "r" * 200
    assert upload.tags == [f"t{i}" for i in range(20)]  # the first 20 tags
    assert upload.note == "hello"
