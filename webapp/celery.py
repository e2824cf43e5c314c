"""The Celery app: ``celery -A webapp.celery:app worker -B``.

Configuration lives in ``webapp/settings.py`` under the ``CELERY_`` prefix. Tasks are
``DjangoTask`` so callers can use ``delay_on_commit``.
"""

from __future__ import annotations

import os

from celery import Celery

from webapp.snapshots.broker import patch_kombu_redis_closed_transport

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
# A Redis restart must not take the worker down with it (docs/reliability.md, kill-redis).
patch_kombu_redis_closed_transport()

app = Celery("webapp", task_cls="celery.contrib.django.task:DjangoTask")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["webapp.snapshots"])
