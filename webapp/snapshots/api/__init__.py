"""The JSON API on django-ninja (contract.md §3): ``site.api`` and its routers by concern
(``uploads``, ``projects``, ``runs``, ``triage``), typed bodies in ``schemas``, authentication and
refusals in ``auth``; ``urls`` is what ``/api/v1/`` includes."""
