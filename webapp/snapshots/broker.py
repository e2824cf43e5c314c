"""Direct checks of the Redis broker: /healthz's ping and the worker's start-up policy check."""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlsplit

log = logging.getLogger(__name__)


def redis_client(url: str, timeout: float = 2.0) -> Any:
    import redis

    parts = urlsplit(url)
    if parts.scheme in {"redis+socket", "socket", "unix"}:
        return redis.Redis(unix_socket_path=parts.path, socket_timeout=timeout, socket_connect_timeout=timeout)
    return redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)


def broker_ping(url: str, timeout: float = 2.0) -> None:
    """Raise unless the Redis broker at ``url`` answers PING."""
    client = redis_client(url, timeout)
    try:
        client.ping()
    finally:
        client.close()


def eviction_policy(url: str) -> str | None:
    """Redis's ``maxmemory_policy`` (from INFO, which managed Redis services allow), or None."""
    client = redis_client(url)
    try:
        return str(client.info("memory").get("maxmemory_policy")) or None
    except Exception:
        return None
    finally:
        client.close()


def warn_unless_noeviction(url: str) -> None:
    """An evicting Redis may drop queued messages and kombu's bindings (reliability.md §3.1)."""
    policy = eviction_policy(url)
    if policy is not None and policy != "noeviction":
        log.warning("Redis maxmemory-policy is %r: set it to 'noeviction' or queued uploads may be lost", policy)
