"""The client's follow-up fields (issue 33): ``--follows`` and ``--changed`` reach the site as the API's
``follows`` and ``changed``; the site's checks of them are in tests/webapp/test_followups.py."""

from __future__ import annotations

from oomscope_client.__main__ import main

from tests.client.test_upload import _base, _parts, server, snapshot_file  # noqa: F401 (fixtures)


def test_cli_sends_follows_and_changed(server, snapshot_file, monkeypatch, capsys):  # noqa: F811
    monkeypatch.setenv("OOMSCOPE_TOKEN", "tok_test_0123456789")
    code = main(
        [
            "upload",
            str(snapshot_file),
            "--url",
            _base(server),
            "--run",
            "bert-mlm",
            "--follows",
            "Xy12ab",
            "--changed",
            "smaller_batch,amp",
        ]
    )
    assert code == 0, capsys.readouterr().err
    (req,) = server.requests
    parts = _parts(req["headers"], req["body"])
    assert parts["follows"] == (None, b"Xy12ab")
    assert parts["changed"] == (None, b"smaller_batch,amp")
    assert parts["run"] == (None, b"bert-mlm")
