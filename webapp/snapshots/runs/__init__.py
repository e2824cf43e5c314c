"""Runs of many ranks and what hangs off them: the run's rows and baselines (``runs``), incidents
and their follow-ups (``followups``), the signed webhook (``webhooks``). Third floor: imports the
bottom modules and ``teams`` (docs/architecture.md, "webapp/ in layers")."""
