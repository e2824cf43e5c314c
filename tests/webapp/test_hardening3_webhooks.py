"""Issue 36, item 2: webhook deliveries on their own queue and worker, each with a total deadline.

The attack: a receiver that accepts the connection and never answers. Its delivery was published on
the analysis queue and held an analysis slot up to 1,800 s (two of them starved another team's
upload past 150 s)."""

from __future__ import annotations

import os
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.webapp import processes
from tests.webapp.helpers import ROOT

RUN_SH = ROOT / "scripts" / "run.sh"


def test_deliveries_are_routed_off_the_analysis_queue(settings: Any) -> None:
    from webapp.celery import app

    def queue_of(task: str) -> str:
        return str(app.amqp.router.route({}, task)["queue"].name)

    assert queue_of("snapshots.deliver_webhook") == settings.WEBHOOK_QUEUE
    assert queue_of("snapshots.deliver_webhook") != queue_of("snapshots.analyse_upload")
    assert queue_of("snapshots.analyse_rank") == queue_of("snapshots.analyse_upload")


def _program(name: str) -> str:
    found = re.search(rf"^\[program:{name}\]\ncommand=(.*)$", RUN_SH.read_text(), re.MULTILINE)
    assert found, f"scripts/run.sh starts no {name} program"
    return found.group(1)


def test_make_run_and_docker_start_a_consumer_of_each_queue() -> None:
    # The analysis worker takes its queue only; a program of its own takes the webhooks' queue.
    assert "-Q ${CELERY_QUEUE:-oomscope} " in _program("worker")
    webhooks = _program("webhooks")
    assert "-Q ${WEBHOOK_QUEUE:-${CELERY_QUEUE:-oomscope}-webhooks}" in webhooks and "--pool prefork" in webhooks
    compose = (ROOT / "docker" / "compose.yml").read_text()
    assert '"-Q", "oomscope-webhooks"' in compose and '"-Q", "oomscope", "--pool"' in compose


@pytest.fixture
def silent_receiver(settings: Any) -> Iterator[str]:
    """A receiver that takes connections and never answers a byte."""
    settings.WEBHOOK_ALLOW_PRIVATE_HOSTS = True
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    yield f"http://127.0.0.1:{server.getsockname()[1]}/hook"
    server.close()


def _delivery(url: str, alice: Any, alpha: Any) -> Any:
    from webapp.snapshots.models import Run, WebhookDelivery

    run = Run.objects.create(code="r-hook", project=alpha, name="hooked")
    return WebhookDelivery.objects.create(run=run, url=url)


@pytest.mark.django_db(transaction=True)
def test_a_silent_receiver_is_given_up_within_the_deadline(
    silent_receiver: str, alice: Any, alpha: Any, start_worker: Any, redis_url: str, tmp_path: Path
) -> None:
    from django.utils import timezone

    from webapp.snapshots.models import WebhookDelivery
    from webapp.snapshots.runs import runs
    from webapp.snapshots.worker import runtasks

    runs.policy_update(alpha, webhook_url=silent_receiver)
    delivery = _delivery(silent_receiver, alice, alpha)
    queue = f"oomscope-test-{os.getpid()}-webhooks"
    env = {"WEBHOOK_QUEUE": queue, "WEBHOOK_ATTEMPT_SECONDS": "2", "WEBHOOK_DEADLINE_SECONDS": "8"}
    env["WEBHOOK_ALLOW_PRIVATE_HOSTS"] = "1"
    argv = processes.celery_worker_argv(queue)
    proc = processes.start_logged(
        argv,
        processes.process_env(redis_url=redis_url, media_root=tmp_path, queue=queue + "-analysis", extra=env),
        tmp_path / "webhooks.log",
    )
    try:
        processes.wait_for_log(proc, b"ready.", "webhooks worker")
        WebhookDelivery.objects.filter(pk=delivery.pk).update(created_at=timezone.now())  # the deadline's start
        # The message carries its time limits (the publisher's task options): the worker's, here.
        runtasks.deliver_webhook.apply_async((delivery.id,), queue=queue, soft_time_limit=2, time_limit=7)
        # Wait on the row, not the clock: each attempt is stopped by its 2 s limit, and the retries
        # stop at the 8 s deadline with the reason recorded (a generous bound for a loaded box).
        for _ in range(600):
            delivery.refresh_from_db()
            if "no more tries" in delivery.error or "deadline" in delivery.error:
                break
            time.sleep(0.1)
        log = (tmp_path / "webhooks.log").read_text()
        assert "no more tries" in delivery.error or "given up" in delivery.error, (delivery.error, log[-3000:])
        assert delivery.attempts >= 2 and delivery.delivered_at is None
        assert "no answer within 2 s" in log  # each attempt stopped by its limit, not urllib's 10 s
    finally:
        processes.stop(proc)
    assert WebhookDelivery.objects.get(pk=delivery.pk).status_code is None


def test_no_attempt_starts_past_the_deadline(
    settings: Any, alice: Any, alpha: Any, db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from webapp.snapshots.models import WebhookDelivery
    from webapp.snapshots.runs import runs
    from webapp.snapshots.worker import runtasks

    delivery = _delivery("https://hooks.example/x", alice, alpha)
    WebhookDelivery.objects.filter(pk=delivery.pk).update(
        created_at=timezone.now() - timedelta(seconds=settings.WEBHOOK_DEADLINE_SECONDS + 1)
    )
    monkeypatch.setattr(runs, "webhook_attempt", lambda _id: pytest.fail("an attempt past the deadline"))
    assert runtasks.deliver_webhook.apply(args=[delivery.id]).get() is False
    delivery.refresh_from_db()
    assert "WEBHOOK_DEADLINE_SECONDS" in delivery.error and delivery.attempts == 0
