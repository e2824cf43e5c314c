"""An upload's way in, each check once and in order (docs/architecture.md, "The upload's walk"): the
limits (``ratelimits``, ``disk``, ``quota``), the file (``uploads``, ``jsonsniff``, ``cost``), the
fields (``forms``), a run's archive (``runarchive``), the checks that need no project (``intake``),
the ones that do and the stored row (``admit``, ``store``), the stored bytes (``blobs``). Fourth
floor: imports the bottom modules, ``teams`` and ``runs``."""
