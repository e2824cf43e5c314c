"""The Django project. Kept import-free so ``python -m webapp.snapshots.worker.child`` loads no Django or Celery."""
