"""The one settings module. Every deployment knob is an environment variable.

Defaults are for a laptop: SQLite in ``var/db.sqlite3``, uploads in ``var/media``,
Redis from ``REDIS_URL`` (``make run`` starts one under ``var/``). Production sets
``SECRET_KEY``, ``DATABASE_URL``, ``REDIS_URL``, ``ALLOWED_HOSTS`` and ``DEBUG=0``.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import secrets
from pathlib import Path
from urllib.parse import unquote, urlsplit

from csp.constants import NONCE, NONE, SELF

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("VAR_DIR", BASE_DIR / "var"))


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else default


def env_list(name: str, default: str) -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


def env_secret(name: str) -> str | None:
    """``NAME`` or the contents of the file named by ``NAME_FILE`` (docker secrets)."""
    if os.environ.get(f"{name}_FILE"):
        return Path(os.environ[f"{name}_FILE"]).read_text().strip()
    return os.environ.get(name) or None


def database_from_url(url: str) -> dict[str, object]:
    """Parse ``postgres://user:pass@host:port/name`` or ``sqlite:///path``."""
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        path = unquote(parts.path)
        # sqlite:///relative/to/repo and sqlite:////absolute, as dj-database-url reads them
        name = path[1:]
        return {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": name if Path(name).is_absolute() else str(BASE_DIR / name),
            # A file (not :memory:) so the end-to-end test's worker process can open it; one per
            # test run, so concurrent runs in one checkout do not share it.
            "TEST": {"NAME": str(VAR_DIR / f"test-{os.getpid()}.sqlite3")},
            # Web and worker processes write at once. WAL lets readers go on while one process
            # writes; IMMEDIATE takes the write lock when a transaction starts, so two writers
            # queue on the busy timeout instead of one failing with "database is locked" when it
            # upgrades a read lock (busy_timeout does not apply to that upgrade). synchronous=NORMAL
            # is the documented safe pairing with WAL (no corruption; a power cut may lose the
            # last commits, not the file).
            "OPTIONS": {
                "timeout": 20,
                "transaction_mode": "IMMEDIATE",
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
        }
    if parts.scheme in {"postgres", "postgresql", "pgsql"}:
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": unquote(parts.path.lstrip("/")),
            "USER": unquote(parts.username or ""),
            "PASSWORD": unquote(parts.password or ""),
            "HOST": parts.hostname or "",
            "PORT": str(parts.port or ""),
            # Short-lived connections: gunicorn and celery prefork processes fork.
            "CONN_MAX_AGE": env_int("DATABASE_CONN_MAX_AGE", 0),
            # A connection that died (PostgreSQL restarted) is replaced, not reused and failed.
            "CONN_HEALTH_CHECKS": True,
            # One test database per test run, so concurrent runs against one server do not collide.
            "TEST": {"NAME": f"test_{unquote(parts.path.lstrip('/'))}_{os.getpid()}"},
        }
    raise ValueError(f"DATABASE_URL scheme {parts.scheme!r} is not supported (postgres or sqlite)")


DEBUG = env_bool("DEBUG", False)


def _secret_key() -> str:
    configured = env_secret("SECRET_KEY")
    if configured:
        return configured
    # Laptop default: a random key kept under var/ so sessions survive restarts.
    key_file = VAR_DIR / "secret_key"
    if not key_file.exists():
        key_file.parent.mkdir(parents=True, exist_ok=True)
        key_file.write_text(secrets.token_urlsafe(50))
        key_file.chmod(0o600)
    return key_file.read_text().strip()


SECRET_KEY = _secret_key()
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", "127.0.0.1,localhost,[::1],testserver")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", "")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "ninja",  # the API (webapp/snapshots/api/): its Swagger UI files under /static/ninja/
    "webapp.snapshots",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "csp.middleware.CSPMiddleware",
]

ROOT_URLCONF = "webapp.urls"
WSGI_APPLICATION = "webapp.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "csp.context_processors.nonce",
                "webapp.snapshots.pages.context_processors.site",
            ],
        },
    },
]

DATABASES = {"default": database_from_url(os.environ.get("DATABASE_URL", "sqlite:///var/db.sqlite3"))}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "snapshots:home"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

# --- static files: our static/ plus BokehJS straight from the installed, pinned bokeh package.
# find_spec locates the package without importing it (the package pages/charts/ is the only importer of bokeh).
STATIC_URL = "/static/"
STATIC_ROOT = Path(os.environ.get("STATIC_ROOT", VAR_DIR / "staticfiles"))
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # WhiteNoise warns on every start without it
BOKEH_VERSION = importlib.metadata.version("bokeh")
_bokeh_spec = importlib.util.find_spec("bokeh")
_bokeh_js = (
    Path(next(iter(_bokeh_spec.submodule_search_locations))) / "server" / "static" / "js"
    if _bokeh_spec and _bokeh_spec.submodule_search_locations
    else None
)
STATICFILES_DIRS: list[object] = [d for d in [BASE_DIR / "static"] if d.is_dir()]
if _bokeh_js is not None:
    STATICFILES_DIRS.append((f"bokeh/{BOKEH_VERSION}", str(_bokeh_js)))
STORAGES: dict[str, dict[str, object]] = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    # Hashed names, gzip/brotli copies, one-year cache after collectstatic (staticstorage.py says how).
    "staticfiles": {"BACKEND": "webapp.snapshots.staticstorage.StaticStorage"},
}
# In DEBUG (tests, laptops) WhiteNoise serves straight from the finders; no collectstatic needed.
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

# --- uploads: untrusted files, stored by content hash through the storage API.
MEDIA_ROOT = Path(os.environ.get("MEDIA_ROOT", VAR_DIR / "media"))
MEDIA_URL = "/media-not-served/"  # uploads are never served back as files
FILE_UPLOAD_TEMP_DIR = os.environ.get("FILE_UPLOAD_TEMP_DIR") or None
# Always stream to a temp file (never hold an upload in memory) and stop at the cap.
FILE_UPLOAD_HANDLERS = ["webapp.snapshots.intake.uploads.CappedHashingUploadHandler"]
UPLOAD_MAX_BYTES = env_int("UPLOAD_MAX_BYTES", 1024**3)
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("DATA_UPLOAD_MAX_MEMORY_SIZE", 2_621_440)  # non-file fields only
DATA_UPLOAD_MAX_NUMBER_FILES = 1

# --- quotas and rate limits (applied in webapp/snapshots/intake/ratelimits.py and quota.py; each defined only here).
# Rates are django-ratelimit's "<count>/<period>" (s, m, h, d, with a multiplier: "60/10m").
TEAM_STORAGE_QUOTA_BYTES = env_int("TEAM_STORAGE_QUOTA_BYTES", 20 * 1024**3)
# The disk guard (webapp/snapshots/intake/disk.py): uploads are refused (507 upload:disk-full) before they
# would leave less than this free where uploads are written, and /healthz says "disk": "low" below it.
DISK_MIN_FREE_BYTES = env_int("DISK_MIN_FREE_BYTES", 1024**3)
# The largest explore store a web process loads for the zoom and digging endpoints (share links are
# anonymous: issue 36); a larger one answers 404 explore:store-too-large (webapp/snapshots/pages/digging.py).
EXPLORE_MAX_STORE_BYTES = env_int("EXPLORE_MAX_STORE_BYTES", 256 * 1024**2)
UPLOAD_RATE_PER_TOKEN = os.environ.get("UPLOAD_RATE_PER_TOKEN", "60/10m")
UPLOAD_RATE_PER_USER = os.environ.get("UPLOAD_RATE_PER_USER", "120/h")
# Idempotency-Key replays (a retry answered with the upload it repeats): their own bucket, per user.
UPLOAD_REPLAY_RATE_PER_USER = os.environ.get("UPLOAD_REPLAY_RATE_PER_USER", "30/m")
LOGIN_RATE_PER_IP = os.environ.get("LOGIN_RATE_PER_IP", "20/m")
LOGIN_RATE_PER_USERNAME = os.environ.get("LOGIN_RATE_PER_USERNAME", "5/m")
SIGNUP_RATE_PER_IP = os.environ.get("SIGNUP_RATE_PER_IP", "5/h")
# Teams a user may own (sign-up makes the first): each team has its own storage quota.
TEAMS_PER_USER_MAX = env_int("TEAMS_PER_USER_MAX", 5)
# Addresses of the proxies in front of the site (comma-separated): behind one of them the client's
# address for the rate limits is read from X-Forwarded-For (ratelimits.client_address), else REMOTE_ADDR.
TRUSTED_PROXIES = frozenset(env_list("TRUSTED_PROXIES", ""))
# A failed upload keeps its file this long (to look at it), then the beat purge removes it.
FAILED_UPLOAD_RETENTION_SECONDS = env_int("FAILED_UPLOAD_RETENTION_SECONDS", 24 * 3600)
PURGE_INTERVAL_SECONDS = env_int("PURGE_INTERVAL_SECONDS", 3600)

if os.environ.get("STORAGE_S3_BUCKET"):
    STORAGES["default"] = {
        "BACKEND": "storages.backends.s3.S3Storage",
        "OPTIONS": {
            "bucket_name": os.environ["STORAGE_S3_BUCKET"],
            "endpoint_url": os.environ.get("STORAGE_S3_ENDPOINT_URL") or None,
            "region_name": os.environ.get("STORAGE_S3_REGION") or None,
            "access_key": env_secret("STORAGE_S3_ACCESS_KEY"),
            "secret_key": env_secret("STORAGE_S3_SECRET_KEY"),
            "file_overwrite": True,  # keys are content hashes: same key, same bytes
            "default_acl": None,
            "querystring_auth": True,
        },
    }

# Where the site is reached from outside (https://oomscope.example): the links in regression
# webhooks, which are sent by a worker with no request to take the host from. Empty: paths only.
SITE_URL = os.environ.get("SITE_URL", "")
# Regression webhooks go only to public addresses unless this is set (a receiver inside the network):
# the URL is a project admin's choice and the worker sends to it (webapp/snapshots/runs/webhooks.py).
WEBHOOK_ALLOW_PRIVATE_HOSTS = env_bool("WEBHOOK_ALLOW_PRIVATE_HOSTS", False)

# --- analysis worker limits (the child process that parses an upload).
ANALYSIS_MEMORY_MIN_BYTES = env_int("ANALYSIS_MEMORY_MIN_BYTES", 1024**3)
ANALYSIS_MEMORY_PER_BYTE = env_int("ANALYSIS_MEMORY_PER_BYTE", 6)
ANALYSIS_MEMORY_MAX_BYTES = env_int("ANALYSIS_MEMORY_MAX_BYTES", 8 * 1024**3)  # x2 workers < a 24 GiB box
ANALYSIS_CPU_SECONDS = env_int("ANALYSIS_CPU_SECONDS", 1200)
ANALYSIS_WALL_SECONDS = env_int("ANALYSIS_WALL_SECONDS", 1500)
ANALYSIS_MAX_ATTEMPTS = env_int("ANALYSIS_MAX_ATTEMPTS", 3)
# Fairness between teams (tasks.analyse_upload): a team running this many analyses lets another
# team's queued upload go first (the slot runs that one at once and puts its own message back); a
# message is put back at most ANALYSIS_MAX_DEFERRALS times, then runs anyway.
ANALYSIS_TEAM_CONCURRENCY = env_int("ANALYSIS_TEAM_CONCURRENCY", 1)
ANALYSIS_MAX_DEFERRALS = env_int("ANALYSIS_MAX_DEFERRALS", 600)
# The estimated analysis cost (bytes to parse: the file, or the uncompressed size a gzip/zip
# declares; webapp/snapshots/intake/cost.py) a team may have queued and running at once. 16 GiB: two
# analyses at the reader's 8 GiB decompression cap; one upload over it alone is refused.
ANALYSIS_MAX_QUEUED_COST_PER_TEAM = env_int("ANALYSIS_MAX_QUEUED_COST_PER_TEAM", 16 * 1024**3)
# Processes per analysis for its policy replays: 1 keeps one analysis to one CPU, as the
# worker's concurrency already spreads uploads over the CPUs; each process gets the rlimits.
ANALYSIS_JOBS = env_int("ANALYSIS_JOBS", 1)
# Each worker pool process keeps one analysis child started ahead of its job, its imports done
# (webapp/snapshots/worker/warmchild.py, issue 34): a small file then costs its own work only.
ANALYSIS_WARM_CHILD = env_bool("ANALYSIS_WARM_CHILD", True)
# The sweep re-queues running rows whose heartbeat is older than this, and re-publishes
# queued rows nobody picked up (lost between commit and publish, or lost by the broker).
SWEEP_STALE_RUNNING_SECONDS = env_int("SWEEP_STALE_RUNNING_SECONDS", 180)
SWEEP_STALE_QUEUED_SECONDS = env_int("SWEEP_STALE_QUEUED_SECONDS", 300)
SWEEP_INTERVAL_SECONDS = env_int("SWEEP_INTERVAL_SECONDS", 60)
# A run of several ranks whose ranks have not all come this long after its first is analysed with
# those it has (webapp/snapshots/runs/runs.py); its queued ranks are analysed alone by the sweep before.
RUN_COLLECT_SECONDS = env_int("RUN_COLLECT_SECONDS", 600)
# The most entries (files, folders, logs) one uploaded tar or zip of a run's ranks may list
# (webapp/snapshots/intake/runarchive.py); the CLI's own cap is analysis.rankfiles.MAX_MEMBERS.
RUN_ARCHIVE_MAX_MEMBERS = env_int("RUN_ARCHIVE_MAX_MEMBERS", 1024)

# --- Celery (read by webapp/celery.py with namespace CELERY_).
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
CELERY_BROKER_URL = REDIS_URL
CELERY_TASK_ALWAYS_EAGER = False
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]  # never pickle on the broker
CELERY_TASK_IGNORE_RESULT = True  # state lives in the Upload row
# A run's ranks are one chord (webapp/snapshots/worker/runtasks.py), which counts its finished parts in a
# result backend: the broker's Redis. Only the chord's parts store a result (an upload id).
CELERY_RESULT_BACKEND = os.environ.get("CELERY_RESULT_BACKEND") or REDIS_URL
CELERY_RESULT_EXPIRES = 24 * 3600
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True  # loops are stopped by Upload.attempts
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SOFT_TIME_LIMIT = ANALYSIS_WALL_SECONDS + 200
CELERY_TASK_TIME_LIMIT = ANALYSIS_WALL_SECONDS + 300
# Redelivery of an unacked message must come well after the hard limit (celery#7651: set it here).
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": max(7200, 2 * CELERY_TASK_TIME_LIMIT)}
CELERY_WORKER_SOFT_SHUTDOWN_TIMEOUT = 30.0
CELERY_WORKER_MAX_MEMORY_PER_CHILD = env_int("WORKER_MAX_MEMORY_KIB", 2_000_000)  # backstop only
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_CONNECTION_RETRY = True  # a lost broker connection is re-established, the worker stays
# On a broker connection loss the running analyses go on and store their outcome (the row is the
# truth, not the ack); cancelling them would throw the work away. A redelivery of their message
# while they run is refused by the claim (the claiming process is alive: jobs.upload_claim).
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = False
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("CELERY_QUEUE", "oomscope")
# Webhook deliveries have their own queue and worker (scripts/run.sh's [program:webhooks], docker/'s
# webhooks service): a slow receiver never holds an analysis slot (issue 36: two of them starved
# another team's upload past 150 s). An attempt (connect, send, read) ends within
# WEBHOOK_ATTEMPT_SECONDS (the task's soft time limit; killed 5 s later), and no attempt starts later
# than WEBHOOK_DEADLINE_SECONDS after the alert was queued.
WEBHOOK_QUEUE = os.environ.get("WEBHOOK_QUEUE", f"{CELERY_TASK_DEFAULT_QUEUE}-webhooks")
WEBHOOK_ATTEMPT_SECONDS = env_int("WEBHOOK_ATTEMPT_SECONDS", 30)
WEBHOOK_DEADLINE_SECONDS = env_int("WEBHOOK_DEADLINE_SECONDS", 3600)
CELERY_TASK_ROUTES = {"snapshots.deliver_webhook": {"queue": WEBHOOK_QUEUE}}
CELERY_BEAT_SCHEDULE = {
    "sweep-stale-uploads": {
        "task": "snapshots.sweep_uploads",
        "schedule": float(SWEEP_INTERVAL_SECONDS),
    },
    "purge-failed-uploads": {
        "task": "snapshots.purge_failed_uploads",
        "schedule": float(PURGE_INTERVAL_SECONDS),
    },
    "close-stale-runs": {  # runs whose missing ranks never came (RUN_COLLECT_SECONDS)
        "task": "snapshots.close_stale_runs",
        "schedule": float(SWEEP_INTERVAL_SECONDS),
    },
    "sweep-orphan-blobs": {  # stored files no upload row names (issue 36: partial blobs of a full disk)
        "task": "snapshots.sweep_orphan_blobs",
        "schedule": float(PURGE_INTERVAL_SECONDS),
    },
    "purge-old-runs": {  # each project's run retention (RunPolicy.retention_days)
        "task": "snapshots.purge_old_runs",
        "schedule": float(PURGE_INTERVAL_SECONDS),
    },
}
# Publishing from a web request must not hang on a dead broker: a short connect timeout and two
# quick retries, then the upload answers "queued, publish pending" and the sweep publishes it.
CELERY_BROKER_CONNECTION_TIMEOUT = float(os.environ.get("BROKER_CONNECTION_TIMEOUT", "2"))
CELERY_TASK_PUBLISH_RETRY_POLICY = {"max_retries": 2, "interval_start": 0, "interval_step": 0.5, "interval_max": 1}
# /healthz waits this long for a worker to answer a Celery ping.
HEALTHZ_WORKER_TIMEOUT = float(os.environ.get("HEALTHZ_WORKER_TIMEOUT", "1.0"))


def _cache_location(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme in {"redis+socket", "socket", "unix"}:
        return f"unix://{parts.path}"
    return url


# The rate limits' counters must be shared by every gunicorn process: the broker's Redis when
# REDIS_URL is set (make run, the container, production). Without it (tests, a bare laptop)
# a per-process memory cache, so limits count per process there.
CACHES = (
    {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": _cache_location(REDIS_URL)}}
    if os.environ.get("REDIS_URL")
    else {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
)

# --- security headers.
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
SESSION_COOKIE_HTTPONLY = True
# Behind a TLS proxy (BEHIND_TLS_PROXY=1, or HTTPS=1) the site is HTTPS-only, so the secure
# defaults follow from it: secure cookies, HTTP -> HTTPS redirects and one year of HSTS.
# Each can still be set on its own. /healthz is exempt from the redirect: load balancers
# probe it over plain HTTP inside the network.
HTTPS_ONLY = not DEBUG and (env_bool("BEHIND_TLS_PROXY", False) or env_bool("HTTPS", False))
SESSION_COOKIE_SECURE = env_bool("SECURE_COOKIES", HTTPS_ONLY)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", HTTPS_ONLY)
SECURE_REDIRECT_EXEMPT = [r"^healthz$"]
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31_536_000 if HTTPS_ONLY else 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", False)
# Waived deploy checks, each for a reason:
SILENCED_SYSTEM_CHECKS = [
    "security.W005",  # HSTS for subdomains depends on the domain, not the app: SECURE_HSTS_INCLUDE_SUBDOMAINS
    "security.W021",  # HSTS preload is a commitment for the whole domain: SECURE_HSTS_PRELOAD
]
if env_bool("BEHIND_TLS_PROXY", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF, NONCE],
        "style-src": [SELF, "'unsafe-inline'"],  # BokehJS injects styles (reliability.md §4.1)
        "img-src": [SELF, "data:"],  # Bokeh's toolbar icons are data: URIs
        "connect-src": [SELF],
        "font-src": [SELF],
        "object-src": [NONE],
        "base-uri": [SELF],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    },
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}
