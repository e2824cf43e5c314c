"""The Celery app: ``celery -A webapp.celery:app worker -B``.

Configuration lives in ``webapp/settings.py`` under the ``CELERY_`` prefix. Tasks are
``DjangoTask`` so callers can use ``delay_on_commit``.
"""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")

app = Celery("webapp", task_cls="celery.contrib.django.task:DjangoTask")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["webapp.snapshots"])
