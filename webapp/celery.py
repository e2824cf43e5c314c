"""The Celery app: ``celery -A webapp.celery:app worker -B``.

Configuration lives in ``webapp/settings.py`` under the ``CELERY_`` prefix. Tasks are
``DjangoTask`` so callers can use ``delay_on_commit``.
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery, bootsteps
from celery.signals import beat_embedded_init

from webapp.snapshots.broker import patch_kombu_redis_closed_transport

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
# A Redis restart must not take the worker down with it (docs/reliability.md, kill-redis).
patch_kombu_redis_closed_transport()

app = Celery("webapp", task_cls="celery.contrib.django.task:DjangoTask")
app.config_from_object("django.conf:settings", namespace="CELERY")
# The worker's two task modules (nothing else imports them: webapp/snapshots/publish.py sends by name).
app.autodiscover_tasks(["webapp.snapshots.worker"])
app.autodiscover_tasks(["webapp.snapshots.worker"], related_name="runtasks")

# How often the worker's main process looks for pool processes that exited (Celery: every 5 s).
POOL_REAP_SECONDS = 0.5


class PoolReaper(bootsteps.StartStopStep):
    """Notice a killed pool process within ``POOL_REAP_SECONDS``, not up to 5 s later.

    Celery's prefork pool learns of a pool process's death from its sentinel pipe, stops watching
    it, and reaps with ``waitpid(WNOHANG)``. As we read it, the pipe closes while the kernel is
    still tearing the process down, so on a busy host that reap can come too early and find
    nothing; the death is then seen by the pool's own 5-second ``maintain_pool`` timer (kill-pool
    measured 4.4-5.8 s before the redelivery in 4 of 16 runs; with this step, under 1 s in 6 of 6).
    Calling the same ``maintain_pool`` twice a second bounds that; it only polls each pool
    process's status.
    """

    requires = ("celery.worker.components:Pool",)

    def start(self, worker: Any) -> None:
        hub = getattr(worker, "hub", None)
        maintain = getattr(getattr(worker, "pool", None), "maintain_pool", None)
        if hub is not None and maintain is not None:  # prefork with an event loop
            hub.call_repeatedly(POOL_REAP_SECONDS, maintain)


app.steps["worker"].add(PoolReaper)


@beat_embedded_init.connect
def beat_dies_with_its_worker(**_kwargs: Any) -> None:
    """The beat of ``worker -B`` runs in a child process of the worker's main process, which Celery
    gives no parent-death signal (its pool processes have one). A SIGKILL of the main process (issue
    22's kill -9, the kernel's OOM killer) left that beat running beside the restarted worker's own:
    two beats, every periodic task sent twice, and a beat no ``make run`` stop or start could see
    (its title and environment rewritten). ``PR_SET_PDEATHSIG`` has the kernel send it SIGKILL when
    its parent dies: the beat process ignores SIGTERM (``SigIgn`` in /proc), and what SIGKILL loses
    (a last write of its schedule file) at worst sends one periodic task again."""
    import ctypes
    import ctypes.util
    import signal

    parent = os.getppid()
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: nothing to ask for
        return
    if os.getppid() != parent:  # the parent died before the request
        os.kill(os.getpid(), signal.SIGKILL)
