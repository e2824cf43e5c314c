"""The triage page (/triage/) and POST /api/v1/triage, on real OOM messages of the captures.

Both answer from ``analysis.triage``; these tests check the way in (login, token, CSRF, limits,
refusals with codes) and that what the page and the API show is that answer, with the real figures.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from analysis.limits import MAX_MESSAGE_CHARS
from analysis.triage import triage
from tests.webapp.helpers import FIXTURES, bearer
from webapp.snapshots.triage import MAX_BODY_BYTES

pytestmark = pytest.mark.django_db

PAGE = "/triage/"
API = "/api/v1/triage"


def truth(path: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / path).read_text())
    return data


OTHER_PROCESS = truth("triage/triage_other_process.truth.json")  # no cap; another process held 100.51 GiB
BENCH = truth("captures/bert_mlm_c70_default.truth.json")  # a 7.27 GiB cap; summary after the unwinding


def post_json(client: Client, body: Any, **extra: Any) -> Any:
    return client.post(API, data=json.dumps(body), content_type="application/json", **extra)


def test_urls_are_the_documented_ones() -> None:
    assert reverse("snapshots:triage") == PAGE
    assert reverse("api:triage") == API


def test_upload_page_links_to_the_triage(alice_client: Client) -> None:
    html = alice_client.get(reverse("snapshots:upload")).content.decode()
    assert f'href="{PAGE}"' in html and "Triage the OOM message alone" in html


def test_page_needs_a_login(client: Client) -> None:
    response = client.get(PAGE)
    assert response.status_code == 302 and response["Location"].startswith(reverse("login"))


def test_page_shows_an_empty_form(alice_client: Client) -> None:
    response = alice_client.get(PAGE)
    html = response.content.decode()
    assert response.status_code == 200
    assert 'name="oom_message"' in html and 'name="memory_summary"' in html and "csrfmiddlewaretoken" in html
    assert 'id="triage-result"' not in html


def test_page_answers_a_real_message_with_its_summary(alice_client: Client) -> None:
    response = alice_client.post(
        PAGE, {"oom_message": OTHER_PROCESS["oom_message"], "memory_summary": OTHER_PROCESS["memory_summary"]}
    )
    assert response.status_code == 200
    html = response.content.decode()
    expected = triage(OTHER_PROCESS["oom_message"], OTHER_PROCESS["memory_summary"])
    assert 'data-cause="outside-process"' in html and 'data-confidence="high"' in html
    assert f"Process {OTHER_PROCESS['holder']['pid']}" in OTHER_PROCESS["oom_message"]
    assert "another process (100.51 GiB)" in html
    assert "no PYTORCH_CUDA_ALLOC_CONF setting gives it back" in html
    # Every finding is on the page, and the figures table holds the message's own figures.
    for finding in expected.findings:
        assert f'data-key="{finding.key}"' in html
    assert "2.00 GiB" in html and "793.56 MiB" in html
    assert "torch.cuda.memory._record_memory_history(max_entries=1_000_000)" in html
    assert "torch.cuda.memory._dump_snapshot(&quot;oom.pickle&quot;)" in html
    # The form keeps what was pasted.
    assert "Process " in html.split('name="oom_message"')[1].split("</textarea>")[0]


def test_page_refuses_a_text_that_is_no_oom_message(alice_client: Client) -> None:
    response = alice_client.post(PAGE, {"oom_message": "RuntimeError: CUDA error: an illegal memory access"})
    assert response.status_code == 400
    html = response.content.decode()
    assert "no &#x27;CUDA out of memory. Tried to allocate ...&#x27; message found" in html
    assert 'id="triage-result"' not in html


def test_page_refuses_a_bad_summary_beside_a_good_message(alice_client: Client) -> None:
    response = alice_client.post(PAGE, {"oom_message": BENCH["oom_message"], "memory_summary": "hello"})
    assert response.status_code == 400
    assert "no torch.cuda.memory_summary() table" in response.content.decode()


def test_page_refuses_a_message_over_the_parsers_cap(alice_client: Client) -> None:
    response = alice_client.post(PAGE, {"oom_message": "x" * (MAX_MESSAGE_CHARS + 1)})
    assert response.status_code == 400
    assert f"at most {MAX_MESSAGE_CHARS}" in response.content.decode()


def test_page_post_needs_the_csrf_token(alice: Any) -> None:
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(alice)
    assert strict.post(PAGE, {"oom_message": BENCH["oom_message"]}).status_code == 403


# ------------------------------------------------------------------ the API


def test_api_needs_authentication(client: Any) -> None:
    response = post_json(client, {"oom_message": BENCH["oom_message"]})
    assert response.status_code == 401 and response.json()["error"]["code"] == "auth-required"
    response = post_json(client, {"oom_message": BENCH["oom_message"]}, **bearer("oom_nope"))
    assert response.status_code == 401 and response.json()["error"]["code"] == "auth-invalid-token"


def test_api_answers_with_a_token(client: Any, alice_token: str) -> None:
    response = post_json(
        client, {"oom_message": BENCH["oom_message"], "memory_summary": BENCH["memory_summary"]}, **bearer(alice_token)
    )
    assert response.status_code == 200
    data = response.json()
    ledger = data.pop("ledger")  # the whole device from the message (tests/webapp/test_ledger_page.py)
    assert sum(r["bytes"] for r in ledger["rows"]) == ledger["total_bytes"]
    assert data == json.loads(json.dumps(triage(BENCH["oom_message"], BENCH["memory_summary"]).to_json()))
    assert data["schema"] == "oomscope.triage/1"
    figures = data["figures"]
    # The run's own cap and memory: the message's ranges hold them.
    assert figures["limit"]["low"] <= BENCH["cap_bytes"] <= figures["limit"]["high"]
    assert figures["limit_kind"] == "per-process-cap" and data["binding_limit"] == "per-process-cap"
    reserved = BENCH["memory_stats"]["reserved_bytes.all.current"]
    assert data["message"]["reserved"]["low"] <= reserved <= data["message"]["reserved"]["high"]
    assert data["summary_timing"] == "after-oom"
    assert data["summary"]["num_ooms"] == BENCH["memory_stats"]["num_ooms"]
    assert data["cause"] == "fragmentation" and data["confidence"] == "low"
    assert "_dump_snapshot" in data["record_snapshot"]


def test_api_without_a_summary(client: Any, bob_token: str) -> None:
    # Any signed-in user may triage: the text names no object of any team.
    response = post_json(client, {"oom_message": OTHER_PROCESS["oom_message"]}, **bearer(bob_token))
    assert response.status_code == 200
    data = response.json()
    assert data["summary"] is None and data["summary_timing"] is None
    assert data["cause"] == "outside-process" and data["figures"]["limit_kind"] == "device-full"
    assert [p["pid"] for p in data["message"]["other_processes"]] == [OTHER_PROCESS["holder"]["pid"]]


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"memory_summary": "x"}, 400, "oom_message:missing"),
        ({"oom_message": 12}, 400, "oom_message:missing"),
        ({"oom_message": "not one"}, 400, "oom_message:unrecognised"),
        ({"oom_message": "x" * (MAX_MESSAGE_CHARS + 1)}, 400, "oom_message:too-long"),
        ({"oom_message": BENCH["oom_message"], "memory_summary": ["a"]}, 400, "memory_summary:not-text"),
        ({"oom_message": BENCH["oom_message"], "memory_summary": "nope"}, 400, "memory_summary:unrecognised"),
        (["oom_message"], 400, "triage:not-json"),
    ],
)
def test_api_refusals_have_codes(client: Any, alice_token: str, body: Any, status: int, code: str) -> None:
    response = post_json(client, body, **bearer(alice_token))
    assert response.status_code == status
    assert response.json()["error"]["code"] == code


def test_api_refuses_what_is_not_json(client: Any, alice_token: str) -> None:
    response = client.post(API, data="{not json", content_type="application/json", **bearer(alice_token))
    assert response.status_code == 400 and response.json()["error"]["code"] == "triage:not-json"
    response = client.post(API, {"oom_message": BENCH["oom_message"]}, **bearer(alice_token))  # a form body
    assert response.status_code == 415 and response.json()["error"]["code"] == "triage:not-json"


def test_api_refuses_a_body_over_its_cap_unread(client: Any, alice_token: str) -> None:
    body = json.dumps({"oom_message": BENCH["oom_message"], "pad": "x" * MAX_BODY_BYTES})
    response = client.post(API, data=body, content_type="application/json", **bearer(alice_token))
    assert response.status_code == 413 and response.json()["error"]["code"] == "triage:too-large"


def test_api_is_post_only(client: Any, alice_token: str) -> None:
    response = client.get(API, **bearer(alice_token))
    assert response.status_code == 405 and response["Allow"] == "POST"


def test_api_by_session_needs_the_csrf_header(alice: Any) -> None:
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(alice)
    response = post_json(strict, {"oom_message": BENCH["oom_message"]})
    assert response.status_code == 403 and response.json()["error"]["code"] == "csrf"
    strict.get(PAGE)  # sets the csrftoken cookie, as the page would
    token = strict.cookies["csrftoken"].value
    response = post_json(strict, {"oom_message": BENCH["oom_message"]}, HTTP_X_CSRFTOKEN=token)
    assert response.status_code == 200 and response.json()["cause"] == "fragmentation"
