"""pgstage settings: every value comes from the environment (django-environ)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env(
    DEBUG=(bool, False),
    SECRET_KEY=(str, "pgstage-insecure-development-key-change-me-in-production"),
    ALLOWED_HOSTS=(list, ["localhost", "127.0.0.1", "testserver"]),
    SWEEP_GRACE_SECONDS=(int, 120),
    DOC_HTML_TRIM_HOURS=(int, 24),
    RELEASE_RETRY_WINDOW_SECONDS=(int, 1800),
    STALLED_WORKER_SECONDS=(int, 30),
    JOB_RETENTION_SECONDS=(int, 3 * 24 * 3600),
    WORKER_GRACEFUL_TIMEOUT_SECONDS=(float, 60.0),
    PGSTAGE_DATA_DIR=(str, str(BASE_DIR / ".data")),
    STORAGE_ROOT=(str, ""),
    STAGING_RETENTION_SECONDS=(int, 24 * 3600),
    METRICS_TOKEN=(str, ""),
    CORE_AVAILABLE=(bool, True),
    CORE_DAILY_BUDGET=(int, 1000),
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
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "config.middleware.DatabaseUnavailableMiddleware",
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
    from config.embedded import embedded_database_url

    url = embedded_database_url(DATA_DIR / "pg")
    # Child processes (workers started by tests or the demo) reuse the same server.
    os.environ["DATABASE_URL"] = url
    return url


DATABASES = {"default": env.db_url_config(_database_url())}
DATABASES["default"]["CONN_MAX_AGE"] = env.int("CONN_MAX_AGE", default=60)
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
DATABASES["default"].setdefault("OPTIONS", {})
# A database that does not answer fails the request in seconds (a 503, see
# config.middleware), instead of holding a web thread for the kernel's TCP timeout.
DATABASES["default"]["OPTIONS"].setdefault("connect_timeout", env("DATABASE_CONNECT_TIMEOUT"))
if env("DATABASE_TRANSACTION_POOLING"):
    # Behind PgBouncer in transaction mode consecutive transactions may run on different
    # server connections: no server-side cursors (they outlive a transaction) and no
    # prepared statements (psycopg prepares a query on its 5th run, on one server).
    DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True
    DATABASES["default"]["OPTIONS"]["prepare_threshold"] = None
DATABASES["default"]["TEST"] = {"NAME": env.str("TEST_DATABASE_NAME", default="") or None}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
AUTH_USER_MODEL = "accounts.User"
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/dashboard/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
FORMAT_MODULE_PATH = ["config.formats"]

STATIC_URL = "static/"
STATIC_ROOT = Path(env.str("STATIC_ROOT", default="") or DATA_DIR / "static")
# whitenoise serves collectstatic's output from the web process itself: compressed, with
# content-hashed names cached for a year (config.storage).
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "config.storage.StaticFilesStorage"},
}

# Domain settings (DESIGN §6).
SWEEP_GRACE_SECONDS = env("SWEEP_GRACE_SECONDS")
DOC_HTML_TRIM_HOURS = env("DOC_HTML_TRIM_HOURS")
RELEASE_RETRY_WINDOW_SECONDS = env("RELEASE_RETRY_WINDOW_SECONDS")
STORAGE_ROOT = Path(env("STORAGE_ROOT") or DATA_DIR / "storage")
STAGING_RETENTION_SECONDS = env("STAGING_RETENTION_SECONDS")
METRICS_TOKEN = env("METRICS_TOKEN")
CORE_AVAILABLE = env("CORE_AVAILABLE")
CORE_DAILY_BUDGET = env("CORE_DAILY_BUDGET")

# queueing: stalled-work recovery treats a worker as dead after this many seconds
# without a heartbeat (procrastinate's workers beat every 10 s).
QUEUEING_STALLED_WORKER_SECONDS = env("STALLED_WORKER_SECONDS")
# queueing: succeeded, cancelled and aborted jobs are deleted after this long (failed
# jobs stay for inspection).
QUEUEING_JOB_RETENTION_SECONDS = env("JOB_RETENTION_SECONDS")
#: The environment variable of each setting named differently, for operators' pages.
SETTING_ENVIRONMENT_NAMES = {
    "QUEUEING_STALLED_WORKER_SECONDS": "STALLED_WORKER_SECONDS",
    "QUEUEING_JOB_RETENTION_SECONDS": "JOB_RETENTION_SECONDS",
}

# Extra task modules for the worker (tests add their own fixture tasks this way).
PROCRASTINATE_IMPORT_PATHS = env.list("PGSTAGE_TASK_MODULES", default=[])

PROCRASTINATE_WORKER_DEFAULTS = {
    "shutdown_graceful_timeout": env("WORKER_GRACEFUL_TIMEOUT_SECONDS"),
    "stalled_worker_timeout": env("STALLED_WORKER_SECONDS"),
}

# Logs: plain lines, or one JSON object per line with LOG_FORMAT=json (queueing.logs).
# procrastinate's worker logger feeds the job lines (start, success, retry, failure, with
# job id, task, key, tenant and duration) and records which worker runs in this process
# for manage.py worker_health (config.worker_state).
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
        "worker_state": {"()": "config.worker_state.WorkerStateHandler"},
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
