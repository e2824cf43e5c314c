"""Teams and who may do what: the access rule (``access``), teams, members and invitations
(``membership``), API tokens (``tokens``), share links (``shares``). Second floor: imports only the
bottom modules (docs/architecture.md, "webapp/ in layers")."""
