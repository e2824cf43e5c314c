"""The Django project. Kept import-free so ``python -m webapp.snapshots.child`` loads no Django or Celery."""
