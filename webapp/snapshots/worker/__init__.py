"""The worker: the Celery tasks (``tasks``; a run's chord, webhooks and retention in ``runtasks``),
the analysis child and its supervisor (``child``, ``runner``), the rows the worker claims and
settles (``jobs``), whether a claiming process still runs (``liveness``). Sixth floor: it renders
the charts (``pages.charts``) in its child, so it sits above the pages."""
