"""pgstage settings: every value comes from the environment (django-environ)."""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path
from urllib.parse import urlsplit

import environ
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent

#: For development only: with DEBUG off, the system check site.E001 refuses to start
#: with it (set SECRET_KEY; `make install` writes a random one to .env for local use).
DEVELOPMENT_SECRET_KEY = "pgstage-insecure-development-key-change-me-in-production"

env = environ.Env(
    DEBUG=(bool, False),
    SECRET_KEY=(str, DEVELOPMENT_SECRET_KEY),
    ALLOWED_HOSTS=(list, ["localhost", "127.0.0.1", "testserver"]),
    SWEEP_GRACE_SECONDS=(int, 120),
    DOC_HTML_TRIM_HOURS=(int, 24),
    RELEASE_RETRY_WINDOW_SECONDS=(int, 1800),
    ANALYSIS_MAX_REQUEUES=(int, 3),
    CORE_HELD_EXPIRY_SECONDS=(int, 600),
    STALLED_WORKER_SECONDS=(int, 30),
    STALLED_RECOVERY_SECONDS=(float, 5.0),
    STALLED_JOB_MAX_RECOVERIES=(int, 3),
    WORKER_HEARTBEAT_SECONDS=(float, 10.0),
    WORKER_POLLING_SECONDS=(float, 5.0),
    DATABASE_OUTAGE_SECONDS=(float, 300.0),
    SWEEP_TRANSACTION_TIMEOUT_SECONDS=(float, 60.0),
    RETRY_MAX_ATTEMPTS=(int, 8),
    RETRY_BASE_SECONDS=(float, 2.0),
    RETRY_CAP_SECONDS=(float, 300.0),
    JOB_RETENTION_SECONDS=(int, 3 * 24 * 3600),
    BUSY_POLL_SECONDS=(float, 2.0),
    JOB_TIMEOUT_SECONDS=(float, 3600.0),
    JOB_TIMEOUT_GRACE_SECONDS=(float, 30.0),
    UNRUNNABLE_CHECK_SECONDS=(float, 60.0),
    WORKER_GRACEFUL_TIMEOUT_SECONDS=(float, 60.0),
    PGSTAGE_DATA_DIR=(str, str(BASE_DIR / ".data")),
    STORAGE_ROOT=(str, ""),
    STAGING_RETENTION_SECONDS=(int, 24 * 3600),
    PIPELINE_LEASE_SECONDS=(float, 300.0),
    PIPELINE_RESUME_GRACE_SECONDS=(int, 60),
    PIPELINE_MAX_RESUMES=(int, 3),
    METRICS_TOKEN=(str, ""),
    CORE_AVAILABLE=(bool, True),
    CORE_DAILY_BUDGET=(int, 1000),
    MAX_QUEUED_ANALYSES_PER_USER=(int, 50),
    MAX_INQUIRIES_PER_TENANT_PER_HOUR=(int, 60),
    AUTH_FAILURE_LIMIT=(int, 10),
    AUTH_FAILURE_WINDOW_SECONDS=(int, 900),
    TRUSTED_PROXY_HOPS=(int, 0),
    SECURE_SSL_REDIRECT=(bool, False),
    SECURE_HSTS_SECONDS=(int, 0),
    SECURE_HSTS_INCLUDE_SUBDOMAINS=(bool, False),
    SECURE_HSTS_PRELOAD=(bool, False),
    SESSION_COOKIE_SECURE=(bool, False),
    CSRF_COOKIE_SECURE=(bool, False),
    TRUST_X_FORWARDED_PROTO=(bool, False),
    CSRF_TRUSTED_ORIGINS=(list, []),
    DATABASE_CONNECT_TIMEOUT=(int, 5),
    DATABASE_TRANSACTION_POOLING=(bool, False),
)
env_file = BASE_DIR / ".env"
if env_file.exists():
    environ.Env.read_env(str(env_file))

DEBUG = env("DEBUG")
SECRET_KEY = env("SECRET_KEY")
ALLOWED_HOSTS = env("ALLOWED_HOSTS")
DATA_DIR = Path(env("PGSTAGE_DATA_DIR"))

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "procrastinate.contrib.django",
    "ninja",
    "accounts",
    "queueing",
    "pipeline",
    "runs",
    "config",
]

MIDDLEWARE = [
    # Outermost: every request's latency and final status, for /metrics.
    "queueing.middleware.RequestMetricsMiddleware",
    # Every error answer under /api/ leaves in the API's error shape.
    "config.api.api_error_middleware",
    "django.middleware.security.SecurityMiddleware",
    "config.middleware.content_security_policy",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "queueing.middleware.DatabaseUnavailableMiddleware",
    # A GET whose filter the database refuses (a NUL, a label outside an enum): 400.
    "queueing.middleware.RefusedQueryMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"

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
            ],
        },
    },
]


def _database_url() -> str:
    url = os.environ.get("DATABASE_URL", "").strip()
    if url:
        return url
    # The embedded server (config.embedded, below): its backend starts it on the first
    # connection and fills in where it listens, so a command that needs no database starts
    # nothing. The processes a command starts (workers) reuse the server.
    from config.embedded import DATABASE_NAME

    return f"postgresql://postgres@/{DATABASE_NAME}"


def database_config(url: str) -> dict:
    """``settings.DATABASES["default"]`` for ``url``, as django-environ parses it; except
    that for a URL that lists several servers (``postgresql://u@h1:5432,h2:5432/db``:
    libpq tries them in turn and takes the first that accepts writes) ``HOST`` and
    ``PORT`` are libpq's own lists — django-environ gives every host the one port when only
    some hosts name one, and keeps an IPv6 address's brackets, which libpq's host list
    refuses — and ``target_session_attrs`` is ``read-write`` unless the URL says
    otherwise. Django's connections, the worker's pool and its LISTEN connection all take
    these parameters (``procrastinate.contrib.django.utils.connector_params``)."""
    config = env.db_url_config(url)
    servers = urlsplit(url).netloc.rpartition("@")[2]
    if "," in servers:
        from psycopg import ProgrammingError
        from psycopg.conninfo import conninfo_to_dict

        try:  # the servers alone: no password, and query options are django-environ's
            params = conninfo_to_dict(f"postgresql://{servers}/")
        except ProgrammingError as exc:
            raise ImproperlyConfigured(f"DATABASE_URL's servers {servers!r}: {exc}") from None
        ports = str(params.get("port") or "")
        if not all(p == "" or (p.isdigit() and 0 < int(p) < 65536) for p in ports.split(",")):
            raise ImproperlyConfigured(
                f"DATABASE_URL's servers {servers!r}: a port is not a number from 1 to 65535"
            )
        config["HOST"] = params.get("host", "")
        config["PORT"] = ports
        # Every pgstage process writes: without it, libpq would settle for a standby.
        config.setdefault("OPTIONS", {}).setdefault("target_session_attrs", "read-write")
    return config


DATABASES = {"default": database_config(_database_url())}
DATABASES["default"]["CONN_MAX_AGE"] = env.int("CONN_MAX_AGE", default=60)
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
DATABASES["default"].setdefault("OPTIONS", {})
# Fail fast on a server that does not answer (a web request gets a 503, see
# queueing.middleware, instead of holding a thread for the kernel's TCP timeout), and notice
# a dead peer within a minute instead of when the operating system's TCP timeout fires
# (hours): a worker thread blocked on a vanished server would hold up the worker's drain.
DATABASES["default"]["OPTIONS"].setdefault("connect_timeout", env("DATABASE_CONNECT_TIMEOUT"))
DATABASES["default"]["OPTIONS"].setdefault("keepalives", 1)
DATABASES["default"]["OPTIONS"].setdefault("keepalives_idle", 30)
DATABASES["default"]["OPTIONS"].setdefault("keepalives_interval", 10)
DATABASES["default"]["OPTIONS"].setdefault("keepalives_count", 3)
# psycopg prepares a statement on its 5th run on a connection (Django turns that off):
# the framework's large statements (a serial queue's admit, the worker's fetch) are then
# planned once per connection. The ORM binds on the client and prepares nothing either way.
DATABASES["default"]["OPTIONS"].setdefault("prepare_threshold", 5)
if env("DATABASE_TRANSACTION_POOLING"):
    # Behind PgBouncer in transaction mode consecutive transactions may run on different
    # server connections: no server-side cursors (they outlive a transaction) and no
    # prepared statements (psycopg prepares a query on its 5th run, on one server).
    DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True
    DATABASES["default"]["OPTIONS"]["prepare_threshold"] = None
DATABASES["default"]["TEST"] = {"NAME": env.str("TEST_DATABASE_NAME", default="") or None}
if not os.environ.get("DATABASE_URL", "").strip():
    DATABASES["default"]["ENGINE"] = "config.embedded"

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
AUTH_USER_MODEL = "accounts.User"
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/dashboard/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
FORMAT_MODULE_PATH = ["config.formats"]

# Deployment safety (docs/security.md): every switch comes from the environment, off by
# default so plain-HTTP development works; `manage.py check --deploy` passes with them on.
SECURE_SSL_REDIRECT = env("SECURE_SSL_REDIRECT")
SECURE_HSTS_SECONDS = env("SECURE_HSTS_SECONDS")
SECURE_HSTS_INCLUDE_SUBDOMAINS = env("SECURE_HSTS_INCLUDE_SUBDOMAINS")
SECURE_HSTS_PRELOAD = env("SECURE_HSTS_PRELOAD")
SESSION_COOKIE_SECURE = env("SESSION_COOKIE_SECURE")
CSRF_COOKIE_SECURE = env("CSRF_COOKIE_SECURE")
CSRF_TRUSTED_ORIGINS = env("CSRF_TRUSTED_ORIGINS")
if env("TRUST_X_FORWARDED_PROTO"):
    # Behind a TLS-terminating proxy that sets (and never passes through) this header.
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

# Content-Security-Policy of every response (config.middleware): the dashboard's and the
# admin's scripts, styles and images come from this origin, with no inline script or
# style; the browser suite (tests/e2e) runs the pages under it.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'"
)

# Request bodies: JSON bodies (and form fields) up to 16 MiB, which every analysis payload
# the schema admits fits (tests/security/test_limits.py). The inquiry upload installs its
# own streaming handler (pipeline.uploads), which refuses too many or too large files.
DATA_UPLOAD_MAX_MEMORY_SIZE = 16 * 1024 * 1024

# Failed logins and wrong API tokens per client address (accounts.throttle); behind N
# reverse proxies set TRUSTED_PROXY_HOPS=N so the address comes from X-Forwarded-For.
AUTH_FAILURE_LIMIT = env("AUTH_FAILURE_LIMIT")
AUTH_FAILURE_WINDOW_SECONDS = env("AUTH_FAILURE_WINDOW_SECONDS")
TRUSTED_PROXY_HOPS = env("TRUSTED_PROXY_HOPS")

STATIC_URL = "static/"
STATIC_ROOT = Path(env.str("STATIC_ROOT", default="") or DATA_DIR / "static")
# Until collectstatic has run (the commands that serve pages run it: run_all, the image
# build), STATIC_ROOT does not exist and whitenoise would warn at every start of a fresh
# checkout (make demo, manage.py shell) about files nothing there serves.
warnings.filterwarnings("ignore", message="No directory at: ", category=UserWarning)
# whitenoise serves collectstatic's output from the web process itself: compressed, with
# content-hashed names cached for a year (config.storage).
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "config.storage.StaticFilesStorage"},
}

# Domain settings (docs/runs.md, docs/pipeline.md).
SWEEP_GRACE_SECONDS = env("SWEEP_GRACE_SECONDS")
DOC_HTML_TRIM_HOURS = env("DOC_HTML_TRIM_HOURS")
RELEASE_RETRY_WINDOW_SECONDS = env("RELEASE_RETRY_WINDOW_SECONDS")
# An active analysis whose process_job was lost this many times fails (refunded).
ANALYSIS_MAX_REQUEUES = env("ANALYSIS_MAX_REQUEUES")
# A held core run no admission took (it died before committing its job) is cancelled,
# its budget unit given back, after this long.
CORE_HELD_EXPIRY_SECONDS = env("CORE_HELD_EXPIRY_SECONDS")
STORAGE_ROOT = Path(env("STORAGE_ROOT") or DATA_DIR / "storage")
STAGING_RETENTION_SECONDS = env("STAGING_RETENTION_SECONDS")
# pipeline: a stage's lease (renewed while it computes), how long a stage without a live
# job waits before the pipeline_resume sweep re-enqueues it, and how often it does that
# before it gives up and leaves the stage failed for an operator.
PIPELINE_LEASE_SECONDS = env("PIPELINE_LEASE_SECONDS")
PIPELINE_RESUME_GRACE_SECONDS = env("PIPELINE_RESUME_GRACE_SECONDS")
PIPELINE_MAX_RESUMES = env("PIPELINE_MAX_RESUMES")
METRICS_TOKEN = env("METRICS_TOKEN")
# The site's own families on /metrics, beside the framework's (queueing.metrics).
QUEUEING_METRICS_SOURCES = ["config.metrics.SiteMetrics"]
# Above the framework's Sweeps page: the analyses whose run is not saved yet.
QUEUEING_SWEEPS_SUMMARY = "config.sweeps_summary.unsaved_runs_summary"
CORE_AVAILABLE = env("CORE_AVAILABLE")
CORE_DAILY_BUDGET = env("CORE_DAILY_BUDGET")
# Resource bounds (429 beyond them): a user's analyses waiting or running, a tenant's
# inquiries per rolling hour; the core's daily budget above is kept per tenant.
MAX_QUEUED_ANALYSES_PER_USER = env("MAX_QUEUED_ANALYSES_PER_USER")
MAX_INQUIRIES_PER_TENANT_PER_HOUR = env("MAX_INQUIRIES_PER_TENANT_PER_HOUR")

# queueing: stalled-work recovery treats a worker as dead after this many seconds
# without a heartbeat (workers beat every WORKER_HEARTBEAT_SECONDS, draining ones too),
# runs every STALLED_RECOVERY_SECONDS (at most half the threshold less 1.5 heartbeats,
# less a second: queueing.E003),
# and gives a job up after its worker died under it STALLED_JOB_MAX_RECOVERIES times
# (its own retries do not count).
QUEUEING_STALLED_WORKER_SECONDS = env("STALLED_WORKER_SECONDS")
QUEUEING_STALLED_RECOVERY_SECONDS = env("STALLED_RECOVERY_SECONDS")
QUEUEING_STALLED_MAX_RECOVERIES = env("STALLED_JOB_MAX_RECOVERIES")
QUEUEING_HEARTBEAT_SECONDS = env("WORKER_HEARTBEAT_SECONDS")
# queueing: a worker keeps trying to reach an unreachable database this long, then exits
# non-zero for its supervisor to restart it.
QUEUEING_DATABASE_OUTAGE_SECONDS = env("DATABASE_OUTAGE_SECONDS")
# queueing: PostgreSQL ends a sweep transaction whose statement or pause between
# statements lasts longer (a worker host that vanished mid-sweep), freeing its locks.
QUEUEING_SWEEP_TRANSACTION_TIMEOUT_SECONDS = env("SWEEP_TRANSACTION_TIMEOUT_SECONDS")
# queueing: the default retry strategy of every task — capped exponential backoff with
# full jitter; a job's last attempt (counting the first run) fails it for good.
QUEUEING_RETRY_MAX_ATTEMPTS = env("RETRY_MAX_ATTEMPTS")
QUEUEING_RETRY_BASE_SECONDS = env("RETRY_BASE_SECONDS")
QUEUEING_RETRY_CAP_SECONDS = env("RETRY_CAP_SECONDS")
# queueing: succeeded, cancelled and aborted jobs are deleted after this long (failed
# jobs stay for inspection).
QUEUEING_JOB_RETENTION_SECONDS = env("JOB_RETENTION_SECONDS")
# queueing: a job whose work a live holder does (a stage "busy") waits this long (jittered
# down to half) before it polls again, without counting an attempt; workers log jobs that
# no live worker has the task of, checked this often.
QUEUEING_BUSY_POLL_SECONDS = env("BUSY_POLL_SECONDS")
QUEUEING_UNRUNNABLE_CHECK_SECONDS = env("UNRUNNABLE_CHECK_SECONDS")
# queueing: one run of a task may take this long unless the task says otherwise (0: no
# bound); past it and the grace, stalled recovery ends the run as a failed attempt, and a
# worker whose slots are all held by such hung runs says so (worker_health fails).
QUEUEING_JOB_TIMEOUT_SECONDS = env("JOB_TIMEOUT_SECONDS")
QUEUEING_JOB_TIMEOUT_GRACE_SECONDS = env("JOB_TIMEOUT_GRACE_SECONDS")
#: The environment variable of each setting named differently, for operators' pages.
SETTING_ENVIRONMENT_NAMES = {
    "QUEUEING_STALLED_WORKER_SECONDS": "STALLED_WORKER_SECONDS",
    "QUEUEING_JOB_RETENTION_SECONDS": "JOB_RETENTION_SECONDS",
}

# Extra task modules for the worker (tests add their own fixture tasks this way).
PROCRASTINATE_IMPORT_PATHS = env.list("PGSTAGE_TASK_MODULES", default=[])

PROCRASTINATE_WORKER_DEFAULTS = {
    "shutdown_graceful_timeout": env("WORKER_GRACEFUL_TIMEOUT_SECONDS"),
    # LISTEN/NOTIFY starts jobs at once; polling is the fallback for a lost notification.
    "fetch_job_polling_interval": env("WORKER_POLLING_SECONDS"),
}
# `manage.py procrastinate worker` runs pgstage's worker (queueing.worker): it keeps
# heart-beating while it drains, rides out database outages and fences job outcomes.
PROCRASTINATE_ON_APP_READY = "queueing.worker.install"

# Logs: plain lines, or one JSON object per line with LOG_FORMAT=json (queueing.logs).
# procrastinate's worker logger feeds the job lines (start, success, retry, failure, with
# job id, task, key, tenant and duration) and records which worker runs in this process
# for manage.py worker_health (queueing.worker_state).
LOG_FORMAT = env.str("LOG_FORMAT", default="plain").strip().lower()
if LOG_FORMAT not in ("plain", "json"):
    raise ImproperlyConfigured(f"LOG_FORMAT={LOG_FORMAT!r}: use 'plain' or 'json'")


def _log_level(name: str, default: str) -> str:
    level = env.str(name, default=default).strip().upper()
    if not isinstance(logging.getLevelName(level), int):
        raise ImproperlyConfigured(f"{name}={level!r}: use DEBUG, INFO, WARNING or ERROR")
    return level


LOG_LEVEL = _log_level("LOG_LEVEL", "WARNING")
PROCRASTINATE_LOG_LEVEL = _log_level("PROCRASTINATE_LOG_LEVEL", "WARNING")
JOB_LOG_LEVEL = _log_level("JOB_LOG_LEVEL", "INFO")
WORKER_STATE_DIR = Path(env.str("WORKER_STATE_DIR", default="") or DATA_DIR / "run" / "workers")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {
        "jobs": {
            "()": "queueing.logs.JobEventFilter",
            "level": PROCRASTINATE_LOG_LEVEL,
            "job_level": JOB_LOG_LEVEL,
        }
    },
    "formatters": {
        "plain": {"()": "queueing.logs.PlainFormatter"},
        "json": {"()": "queueing.logs.JsonFormatter"},
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT},
        "jobs": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT, "filters": ["jobs"]},
        "worker_state": {"()": "queueing.worker_state.WorkerStateHandler"},
    },
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {
        "procrastinate": {"level": PROCRASTINATE_LOG_LEVEL},
        "procrastinate.worker": {
            # INFO at most: the worker's start record carries the id worker_health needs.
            "level": min(logging.INFO, logging.getLevelName(PROCRASTINATE_LOG_LEVEL)),
            "handlers": ["jobs", "worker_state"],
            "propagate": False,
        },
        "queueing": {"level": _log_level("LOG_LEVEL", "INFO")},
    },
}
