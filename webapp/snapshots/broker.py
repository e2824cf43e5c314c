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


def patch_kombu_redis_closed_transport() -> None:
    """Make kombu's Redis channel treat a detached transport as a lost connection (idempotent).

    kombu 5.7.0 (the latest release; no setting changes this path), when Redis dies while a
    message is unacked (our acks_late analysis is running): Celery's consumer calls
    ``Connection.collect()``, whose channel close fails half-way on the dead socket (so the
    channel is not marked closed) and which then detaches the transport
    (``transport.client = None``); the ``Connection.close()`` that follows closes the channel again,
    its ``restore_unacked`` asks for a new Redis pool and ``Channel._connparams`` reads
    ``None.hostname``: ``AttributeError``, which is not a connection error, so the consumer dies and
    the worker exits 1 (kombu#582 / #970 family). Raising redis' ``ConnectionError`` there instead
    lets Celery's own error handling go on and reconnect. Nothing is restored on that dead
    channel: the running analysis finishes and stores its outcome, and its message, left unacked
    in Redis, comes back after the visibility timeout to a finished row and does nothing.
    Remove once kombu no longer closes a channel after detaching its transport.
    """
    from kombu.transport import redis as kombu_redis
    from redis.exceptions import ConnectionError as RedisConnectionError

    channel: Any = kombu_redis.Channel
    original = channel._connparams
    if getattr(original, "oomscope_patched", False):
        return

    def _connparams(self: Any, asynchronous: bool = False) -> Any:
        if self.connection.client is None:
            raise RedisConnectionError("broker connection closed")
        return original(self, asynchronous=asynchronous)

    _connparams.oomscope_patched = True  # type: ignore[attr-defined]
    channel._connparams = _connparams
