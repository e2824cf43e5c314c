"""Issue 35, "the API as a schema": the served OpenAPI document (``/api/v1/openapi.json``) is the
contract, and every route's live answers, successes and refusals, validate against it.

One scripted walk through the API on real captures (``tests/fixtures``: a run that lived and one that
died, analysed as the worker does; a real two-rank DDP job sent as one archive) calls every documented
operation; each answer's status must be documented for its operation, its body must validate
(``jsonschema``, Draft 2020-12, against the document's own ``components``) and the headers the document
names for it must be there. The document's routes are those docs/contract.md lists.
"""

from __future__ import annotations

import io
import json
import re
import tarfile
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from jsonschema import Draft202012Validator

from tests.webapp.helpers import FIXTURES, bearer
from webapp.snapshots.models import Run, Upload
from webapp.snapshots.teams import tokens
from webapp.snapshots.worker.tasks import analyse_upload

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "/api/v1"
LIVED = FIXTURES / "captures" / "gpt_autocast_c75_expandable.pickle.gz"
DIED = FIXTURES / "captures" / "gpt_autocast_c75_default.pickle.gz"
RANKS = FIXTURES / "runs"
OOM_MESSAGE = json.loads((RANKS / "ddp_gloo_rank0.json").read_text())["oom_message"]


class Contract:
    """The served document, and the answers checked against it: (method, route, status) seen."""

    def __init__(self, document: dict[str, Any]) -> None:
        self.document = document
        self.seen: set[tuple[str, str, int]] = set()

    def validator(self, schema: dict[str, Any]) -> Draft202012Validator:
        # The operation's schema, with the document's components beside it for its "#/components/..." refs.
        return Draft202012Validator({**schema, "components": self.document["components"]})

    def problems(self, method: str, route: str, status: int, body: Any) -> list[str]:
        answer = self.document["paths"][PREFIX + route][method]["responses"].get(str(status))
        if answer is None:
            return [f"{method.upper()} {route}: status {status} is not in the document"]
        schema = answer["content"]["application/json"]["schema"]
        return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in self.validator(schema).iter_errors(body)]

    def check(self, response: Any, method: str, route: str, status: int) -> Any:
        """``response`` (to ``method`` ``route``) has ``status``, a documented body and its documented headers."""
        assert response.status_code == status, (method, route, response.status_code, response.content[:400])
        body = json.loads(response.content)
        assert self.problems(method, route, status, body) == [], (method, route, status, body)
        answer = self.document["paths"][PREFIX + route][method]["responses"][str(status)]
        for header in answer.get("headers", {}):
            if header != "Idempotent-Replayed" or status == 200:  # a replay's mark, only on a replay
                assert response.has_header(header), (method, route, status, header)
        self.seen.add((method, route, status))
        return body

    def operations(self) -> set[tuple[str, str]]:
        return {(m, p.removeprefix(PREFIX)) for p, ops in self.document["paths"].items() for m in ops}


def _document(client: Client, token: str) -> dict[str, Any]:
    response = client.get(f"{PREFIX}/openapi.json", **bearer(token))
    assert response.status_code == 200 and response["Content-Type"].startswith("application/json")
    document: dict[str, Any] = response.json()
    return document


def _post(client: Client, token: str, data: bytes, name: str, key: str = "", **fields: Any) -> Any:
    upload = io.BytesIO(data)
    upload.name = name
    extra = {"HTTP_IDEMPOTENCY_KEY": key} if key else {}
    return client.post(f"{PREFIX}/snapshots", {"file": upload, **fields}, **bearer(token), **extra)


def _ranks_tar() -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as archive:
        for path in sorted(RANKS.glob("ddp_gloo_rank*")):
            archive.add(path, arcname=f"job/{path.name}")
    return out.getvalue()


def _analysed(client: Client, token: str, c: Contract, path: Path, capture: Any, **fields: Any) -> Upload:
    """Sent (202, and 200 when sent again under its key), then analysed as the worker does."""
    key = f"contract-{path.name}"
    with capture():
        sent = c.check(_post(client, token, path.read_bytes(), path.name, key, **fields), "post", "/snapshots", 202)
        again = c.check(_post(client, token, path.read_bytes(), path.name, key, **fields), "post", "/snapshots", 200)
    assert again["id"] == sent["id"]
    upload = Upload.objects.get(code=sent["id"])
    analyse_upload(upload.id)
    return upload


@pytest.fixture
def contract(client: Client, alice_token: str) -> Contract:
    return Contract(_document(client, alice_token))


def _uploads(client: Client, token: str, c: Contract, capture: Any, settings: Any) -> dict[str, Any]:
    """The upload routes, each answer checked; returns what later steps name."""
    base = _analysed(client, token, c, LIVED, capture, run="base", branch="main")
    worse = _analysed(client, token, c, DIED, capture, run="worse", branch="feature")
    with capture():
        made = c.check(_post(client, token, _ranks_tar(), "job.tar.gz", world_size="2"), "post", "/snapshots", 202)
    assert set(made) == {"run"} and made["run"]["world_size"] == 2
    c.check(client.post(f"{PREFIX}/snapshots", {"run": "x"}, **bearer(token)), "post", "/snapshots", 400)
    refused = _post(client, token, LIVED.read_bytes(), LIVED.name, project="nowhere")
    assert c.check(refused, "post", "/snapshots", 404)["error"]["choices"] == ["alpha"]
    c.check(_post(client, token, b"<html>no snapshot</html>", "page.pickle"), "post", "/snapshots", 422)
    settings.UPLOAD_MAX_BYTES = 1000
    c.check(_post(client, token, LIVED.read_bytes(), LIVED.name), "post", "/snapshots", 413)
    settings.UPLOAD_MAX_BYTES = 1024**3

    one = "/snapshots/{code}"
    c.check(client.get(f"{PREFIX}/snapshots/{worse.code}", **bearer(token)), "get", one, 200)
    c.check(client.get(f"{PREFIX}/snapshots/nothing", **bearer(token)), "get", one, 404)
    c.check(client.get(f"{PREFIX}/snapshots/{worse.code}/report", **bearer(token)), "get", one + "/report", 200)
    rank = made["run"]["uploads"][0]["id"]
    waiting = client.get(f"{PREFIX}/snapshots/{rank}/report", **bearer(token))
    assert c.check(waiting, "get", one + "/report", 404)["error"]["code"] == "report-not-ready"

    share = f"{PREFIX}/snapshots/{worse.code}/share"
    link = c.check(client.post(share, {"name": "issue"}, **bearer(token)), "post", one + "/share", 201)
    assert c.check(client.get(share, **bearer(token)), "get", one + "/share", 200)["links"][0] == link["link"]
    c.check(client.delete(f"{share}?key=nope", **bearer(token)), "delete", one + "/share", 404)
    assert c.check(client.delete(share, **bearer(token)), "delete", one + "/share", 200)["revoked"] == 1

    follows = f"{PREFIX}/snapshots/{worse.code}/follows"
    bad = client.post(follows, {"changed": "no-such-change"}, **bearer(token))
    assert "amp" in c.check(bad, "post", one + "/follows", 400)["error"]["choices"]
    c.check(
        client.post(follows, {"follows": base.code, "changed": "amp"}, **bearer(token)), "post", one + "/follows", 200
    )
    assert c.check(client.get(follows, **bearer(token)), "get", one + "/follows", 200)["follows"]["code"] == base.code
    return {"base": base, "worse": worse, "archive_run": made["run"]["id"], "rank": rank}


def _projects(client: Client, token: str, c: Contract, alice: Any) -> None:
    assert (
        c.check(client.get(f"{PREFIX}/projects", **bearer(token)), "get", "/projects", 200)["projects"][0]["slug"]
        == "alpha"
    )
    history = c.check(client.get(f"{PREFIX}/projects/alpha/runs", **bearer(token)), "get", "/projects/{slug}/runs", 200)
    assert any(row["summary"] and row["summary"]["oom"] for row in history["runs"])  # the analysed OOM's figures
    c.check(client.get(f"{PREFIX}/projects/nowhere/runs", **bearer(token)), "get", "/projects/{slug}/runs", 404)
    c.check(client.get(f"{PREFIX}/projects/alpha/advice", **bearer(token)), "get", "/projects/{slug}/advice", 200)
    c.check(client.get(f"{PREFIX}/advice", **bearer(token)), "get", "/advice", 403)
    alice.is_staff = True
    alice.save(update_fields=["is_staff"])
    c.check(client.get(f"{PREFIX}/advice", **bearer(token)), "get", "/advice", 200)


def _runs(client: Client, token: str, c: Contract, made: dict[str, Any]) -> None:
    worse = Run.objects.get(name="worse")
    assert worse.regression is not None  # the new OOM against "base", the latest run on main
    got = c.check(client.get(f"{PREFIX}/runs/{worse.code}", **bearer(token)), "get", "/runs/{run_code}", 200)
    assert got["regression"]["new_oom"] is True and got["uploads"][0]["status"] == "done"
    c.check(client.get(f"{PREFIX}/runs/{made['archive_run']}", **bearer(token)), "get", "/runs/{run_code}", 200)
    c.check(client.get(f"{PREFIX}/runs/nothing", **bearer(token)), "get", "/runs/{run_code}", 404)
    c.check(
        client.get(f"{PREFIX}/projects/alpha/run-list?branch=main", **bearer(token)),
        "get",
        "/projects/{slug}/run-list",
        200,
    )
    gate = f"{PREFIX}/projects/alpha/regression"
    route = "/projects/{slug}/regression"
    assert (
        c.check(client.get(f"{gate}?run=worse&max_regression=1%", **bearer(token)), "get", route, 200)["regressed"]
        is True
    )
    assert c.check(client.get(f"{gate}?run=nothing", **bearer(token)), "get", route, 200)["status"] == "no-run"
    c.check(client.get(f"{gate}?max_regression=nan", **bearer(token)), "get", route, 400)
    archive = Run.objects.get(code=made["archive_run"])
    assert c.check(client.get(f"{gate}?run={archive.name}", **bearer(token)), "get", route, 200)["status"] == "pending"

    policy = f"{PREFIX}/projects/alpha/policy"
    c.check(client.get(policy, **bearer(token)), "get", "/projects/{slug}/policy", 200)
    changed = c.check(
        client.post(policy, {"max_regression_pct": "7"}, **bearer(token)), "post", "/projects/{slug}/policy", 200
    )
    assert changed["policy"]["max_regression_pct"] == 7.0 and changed["changes"]
    c.check(client.post(policy, {"max_regression_pct": "-1"}, **bearer(token)), "post", "/projects/{slug}/policy", 400)
    tried = client.post(f"{PREFIX}/projects/alpha/webhook/test", **bearer(token))
    assert c.check(tried, "post", "/projects/{slug}/webhook/test", 200)["delivered"] is False  # no webhook set

    base = Run.objects.get(name="base")
    pin = f"{PREFIX}/runs/{base.code}/baseline"
    assert (
        c.check(client.post(pin, **bearer(token)), "post", "/runs/{run_code}/baseline", 200)["policy"]["baseline"]
        == "pinned"
    )
    assert (
        c.check(client.delete(pin, **bearer(token)), "delete", "/runs/{run_code}/baseline", 200)["policy"]["baseline"]
        == "latest-main"
    )
    c.check(
        client.post(f"{PREFIX}/runs/{archive.code}/analyse", **bearer(token)), "post", "/runs/{run_code}/analyse", 202
    )
    c.check(client.delete(f"{PREFIX}/runs/{archive.code}", **bearer(token)), "delete", "/runs/{run_code}", 200)


def _triage_and_deletes(client: Client, token: str, c: Contract, made: dict[str, Any]) -> None:
    answer = client.post(
        f"{PREFIX}/triage", {"oom_message": OOM_MESSAGE}, content_type="application/json", **bearer(token)
    )
    assert c.check(answer, "post", "/triage", 200)["schema"] == "oomscope.triage/1"
    c.check(client.post(f"{PREFIX}/triage", "text", content_type="text/plain", **bearer(token)), "post", "/triage", 415)
    c.check(
        client.post(f"{PREFIX}/triage", {}, content_type="application/json", **bearer(token)), "post", "/triage", 400
    )
    gone = client.delete(f"{PREFIX}/snapshots/{made['base'].code}", **bearer(token))
    assert c.check(gone, "delete", "/snapshots/{code}", 200) == {"id": made["base"].code, "deleted": True}


def test_every_route_answers_as_the_served_document_says(
    client: Client,
    alice: Any,
    alice_token: str,
    contract: Contract,
    settings: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    made = _uploads(client, alice_token, contract, django_capture_on_commit_callbacks, settings)
    _projects(client, alice_token, contract, alice)
    _runs(client, alice_token, contract, made)
    _triage_and_deletes(client, alice_token, contract, made)
    # The refusals every route shares: no credentials, a bad token, a gate token's change, a session's
    # change without its CSRF token.
    c = contract
    c.check(Client().get(f"{PREFIX}/projects"), "get", "/projects", 401)
    c.check(client.get(f"{PREFIX}/projects", **bearer("oos_not-a-token")), "get", "/projects", 401)
    gate = tokens.api_token_create(alice, scope="gate")
    c.check(
        client.post(f"{PREFIX}/projects/alpha/policy", {"main_branch": "x"}, **bearer(gate)),
        "post",
        "/projects/{slug}/policy",
        403,
    )
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(alice)
    refused = c.check(
        browser.post(f"{PREFIX}/runs/{made['archive_run']}/analyse"), "post", "/runs/{run_code}/analyse", 403
    )
    assert refused["error"]["code"] == "csrf"

    untried = {op for op in c.operations() if not any(s < 300 for m, r, s in c.seen if (m, r) == op)}
    assert untried == set(), "a documented operation no success of this walk checked"
    refusals = {s for _m, _r, s in c.seen if s >= 400}
    assert refusals >= {400, 401, 403, 404, 413, 415, 422}, sorted(refusals)
    print(f"\n{len(c.seen)} (method, route, status) checked, {len(c.operations())} operations; {sorted(refusals)}")


def _contract_routes() -> set[tuple[str, str]]:
    """The (method, route) pairs docs/contract.md lists, in the document's spelling of their parameters."""
    text = (ROOT / "docs" / "contract.md").read_text()
    spelled = {"<id>": "{code}", "<slug>": "{slug}", "<run_id>": "{run_code}"}
    found = set()
    for method, path in re.findall(r"^(GET|POST|DELETE|PUT|PATCH) +/api/v1(/\S*)", text, flags=re.M):
        for contract_name, ours in spelled.items():
            path = path.replace(contract_name, ours)
        found.add((method.lower(), path))
    return found


def test_the_documents_operations_are_the_routes_the_contract_lists(contract: Contract) -> None:
    documents = {("get", "/openapi.json"), ("get", "/docs")}  # the document and its page, not in it
    assert contract.operations() == _contract_routes() - documents
    assert len(contract.operations()) == 24


def test_the_document_is_well_formed_and_every_operation_names_its_callers_and_refusals(contract: Contract) -> None:
    document = contract.document
    assert document["openapi"].startswith("3.1") and document["info"]["title"] == "oomscope"
    for name, schema in document["components"]["schemas"].items():
        Draft202012Validator.check_schema(schema)  # raises for a schema that is not JSON Schema
        assert name in json.dumps(document["paths"]) or name in json.dumps(document["components"]), name
    ids = [op["operationId"] for ops in document["paths"].values() for op in ops.values()]
    assert len(ids) == len(set(ids)) == 24
    for path, ops in document["paths"].items():
        for method, op in ops.items():
            assert op["security"] == [{"BearerToken": []}, {"Session": []}], (method, path)
            assert {"401", "403", "404", "503"} <= set(op["responses"]), (method, path)
            refusal = op["responses"]["401"]
            assert refusal["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Error"}
            assert "WWW-Authenticate" in refusal["headers"]
    upload = document["paths"]["/api/v1/snapshots"]["post"]
    form = upload["requestBody"]["content"]["multipart/form-data"]["schema"]
    assert (form["properties"]["file"]["type"], form["properties"]["file"]["format"]) == ("string", "binary")
    assert form["required"] == ["file"]
    triage = document["paths"]["/api/v1/triage"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert triage["required"] == ["oom_message"]


def test_a_body_that_drifts_from_the_document_fails_it(
    client: Client, alice: Any, alpha: Any, alice_token: str, contract: Contract
) -> None:
    """The check bites: the live row of a queued upload passes; the same with a key gone, a figure
    turned to text or a status the contract does not name fails."""
    from tests.webapp.helpers import make_upload

    upload = make_upload(alpha, alice, LIVED)
    body = contract.check(
        client.get(f"{PREFIX}/snapshots/{upload.code}", **bearer(alice_token)), "get", "/snapshots/{code}", 200
    )
    assert body["status"] == "queued" and body["summary"] is None
    route = ("get", "/snapshots/{code}", 200)
    assert contract.problems(*route, {k: v for k, v in body.items() if k != "status"}) == [
        ": 'status' is a required property"
    ]
    assert contract.problems(*route, body | {"progress": "half"}) == ["progress: 'half' is not of type 'integer'"]
    assert len(contract.problems(*route, body | {"status": "lost"})) == 1
    assert contract.problems("get", "/snapshots/{code}", 418, body) == [
        "GET /snapshots/{code}: status 418 is not in the document"
    ]


def test_a_method_a_route_does_not_take_and_an_unknown_path_answer_the_documents_error(
    client: Client, alice_token: str, contract: Contract
) -> None:
    error = contract.validator({"$ref": "#/components/schemas/Error"})
    refused = client.put(f"{PREFIX}/projects", **bearer(alice_token))
    assert refused.status_code == 405 and refused["Allow"] == "GET"
    assert list(error.iter_errors(refused.json())) == [] and refused.json()["error"]["code"] == "method-not-allowed"
    head = client.head(f"{PREFIX}/projects", **bearer(alice_token))  # HEAD is no GET here, as before ninja
    assert head.status_code == 405
    unknown = client.get(f"{PREFIX}/no-such-route", **bearer(alice_token))
    assert unknown.status_code == 404 and list(error.iter_errors(unknown.json())) == []
    anonymous = Client().get(f"{PREFIX}/openapi.json")  # the document is for callers, as every /api/v1/ path
    assert anonymous.status_code == 401 and list(error.iter_errors(anonymous.json())) == []
    posted = client.post(f"{PREFIX}/openapi.json", **bearer(alice_token))
    assert posted.status_code == 405 and posted["Allow"] == "GET"
