"""Settings for the training-job console.

Two modes share every line of application code and differ only in transports:
- embedded (default, the README's run command): SQLite, in-memory channel layer,
  in-process Celery worker with the memory:// broker;
- production / tests: DATABASE_URL (PostgreSQL) and REDIS_URL (Channels layer and
  Celery broker), with separate daphne and Celery worker processes.
"""

import os
from pathlib import Path

import dj_database_url

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("CONSOLE_VAR_DIR", BASE_DIR / "var"))

# Production mode: a database or broker of the operator's (README, "Production"). It is safe
# when it starts: DEBUG off unless DJANGO_DEBUG=1 (an error page would show the database and
# broker URLs), a secret key of its own.
PRODUCTION = bool(os.environ.get("DATABASE_URL") or os.environ.get("REDIS_URL"))
DEBUG = os.environ.get("DJANGO_DEBUG", "0" if PRODUCTION else "1") == "1"


def _secret_key() -> str:
    """DJANGO_SECRET_KEY, or a key generated once into a file outside the repository's tracked
    files (CONSOLE_SECRET_KEY_FILE, var/secret-key by default; mode 0600): never a fixed string."""
    if os.environ.get("DJANGO_SECRET_KEY"):
        return os.environ["DJANGO_SECRET_KEY"]
    path = Path(os.environ.get("CONSOLE_SECRET_KEY_FILE", VAR_DIR / "secret-key"))
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    import secrets

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(secrets.token_urlsafe(50))
    try:
        os.link(tmp, path)  # the first process to get there wins; the others read its key
    except FileExistsError:
        pass
    finally:
        tmp.unlink()
    return path.read_text().strip()


SECRET_KEY = _secret_key()
ALLOWED_HOSTS = os.environ.get("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost,[::1]").split(",")
CSRF_TRUSTED_ORIGINS = [o for o in os.environ.get("DJANGO_CSRF_TRUSTED_ORIGINS", "").split(",") if o]
# Behind TLS (a reverse proxy that terminates it and sets X-Forwarded-Proto): DJANGO_SECURE=1.
if os.environ.get("DJANGO_SECURE") == "1":
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = True
    SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = int(os.environ.get("DJANGO_HSTS_SECONDS", "31536000"))
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = os.environ.get("DJANGO_HSTS_PRELOAD") == "1"
    # Submitting the domain to the browsers' preload list is the operator's commitment, asked
    # for with DJANGO_HSTS_PRELOAD=1; not a warning of every deployment.
    SILENCED_SYSTEM_CHECKS = ["security.W021"]

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI served from our static files: no CDN is reachable
    "channels",
    "django_htmx",
    "console",
    "jobs",
    "faulttolerance",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    # The page's language: the user's remembered choice (console.language, from the session), else
    # the language cookie the switcher sets, else the browser's Accept-Language, else English.
    "django.middleware.locale.LocaleMiddleware",
    "console.language.UserLanguageMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

ROOT_URLCONF = "console.urls"
ASGI_APPLICATION = "console.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.template.context_processors.i18n",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASE_URL = os.environ.get("DATABASE_URL")
if DATABASE_URL:
    # A connection pool (psycopg_pool): a worker's followers (one thread per running instance)
    # hand their connection back between writes, so hundreds of them share a few connections.
    DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=0)}
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": 1,
        "max_size": int(os.environ.get("CONSOLE_DB_POOL_SIZE", "20")),
        "timeout": 30,
    }
else:
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": VAR_DIR / "console.sqlite3",
            # Worker threads and the web server write concurrently: WAL plus
            # IMMEDIATE transactions make SQLite serialise writers instead of
            # failing with "database is locked".
            "OPTIONS": {
                "timeout": 30,
                "transaction_mode": "IMMEDIATE",
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
        }
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = os.environ.get("REDIS_URL")
EMBEDDED = not REDIS_URL

if REDIS_URL:
    # The Redis client's socket timeout bounds every read on the channel layer's connections,
    # the reply to its blocking receive too: channels-redis waits for a consumer's next message
    # with BZPOPMIN for RedisChannelLayer.brpop_timeout (5 s), then issues it again. With redis-py
    # 8's default socket timeout, also 5 s (redis/_defaults.py), the nil reply of an idle receive
    # raced the client's timer and a websocket quiet for 5-10 s died with 1011. It must stay above
    # the blocking receive: console/asgi.py refuses to start otherwise (console.realtime).
    CHANNELS_REDIS_SOCKET_TIMEOUT_S = float(os.environ.get("CONSOLE_CHANNELS_REDIS_SOCKET_TIMEOUT_S", "10"))
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {
                # A dict host is passed to redis-py as it is (channels_redis.utils.create_pool);
                # options in REDIS_URL's query string win over it.
                "hosts": [{"address": REDIS_URL, "socket_timeout": CHANNELS_REDIS_SOCKET_TIMEOUT_S}],
                "prefix": os.environ.get("CHANNELS_PREFIX", "console"),
                # Log pushes come in bursts; a consumer that falls behind is
                # back-filled from the persisted log, so drops are harmless.
                "capacity": 1000,
                "expiry": 30,
            },
        }
    }
    CELERY_BROKER_URL = REDIS_URL
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer", "CONFIG": {"capacity": 1000}}}
    CELERY_BROKER_URL = "memory://"
    # memory:// polls; the default 1 s interval would add a second to every step.
    CELERY_BROKER_TRANSPORT_OPTIONS = {"polling_interval": 0.05}

CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("CELERY_QUEUE", "console")
# The supervisor's control tasks (start, stop, decide, schedule, reconcile) have a queue of their
# own, so that a worker started with `-Q <queue>.control` runs nothing else: no export of a large
# log, webhook retry or volume removal ever delays a Stop or a restart (docs/decisions.md).
CELERY_CONTROL_QUEUE = f"{CELERY_TASK_DEFAULT_QUEUE}.control"
CELERY_TASK_QUEUES = {CELERY_TASK_DEFAULT_QUEUE: {}, CELERY_CONTROL_QUEUE: {}}  # a worker takes both by default
CELERY_TASK_ROUTES = {
    f"jobs.tasks.{name}": {"queue": CELERY_CONTROL_QUEUE}
    for name in (
        "schedule_job",
        "start_attempt",
        "end_attempt",
        "stop_job",
        "stop_instance",
        "follow_task_run",
        "reconcile",
    )
}
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_ALWAYS_EAGER = False
# How often the reconcile step runs (re-adopts containers, starts queued jobs).
RECONCILE_INTERVAL_S = float(os.environ.get("CONSOLE_RECONCILE_INTERVAL_S", "3"))
CELERY_BEAT_SCHEDULE = {
    "reconcile": {"task": "jobs.tasks.reconcile", "schedule": RECONCILE_INTERVAL_S},
}
# A host whose engine refuses the connection is isolated at the next reconcile; one whose pings
# time out (busy or hung) only once it has answered none for this long (jobs/runtime/liveness.py).
HOST_LOST_AFTER_S = float(os.environ.get("CONSOLE_HOST_LOST_AFTER_S", "15"))

# Networks the console may send webhooks to although they are not public (jobs/outbound.py):
# comma-separated addresses or CIDRs, e.g. "10.1.2.0/24". Empty: public addresses only.
OUTBOUND_ALLOW = [net.strip() for net in os.environ.get("CONSOLE_OUTBOUND_ALLOW", "").split(",") if net.strip()]
# An open page's websocket checks again this often that its user may still see what it shows.
WS_ACCESS_RECHECK_S = float(os.environ.get("CONSOLE_WS_ACCESS_RECHECK_S", "5"))
# A follower that has not renewed its heartbeat for this long is presumed dead
# and its task run is adopted by another worker.
FOLLOWER_STALE_AFTER_S = float(os.environ.get("CONSOLE_FOLLOWER_STALE_AFTER_S", "10"))
# A container whose instance ended and that nobody removed (its follower died) is removed by
# reconcile once it ended this long ago (jobs/runtime/cleanup.py).
ORPHAN_GRACE_S = float(os.environ.get("CONSOLE_ORPHAN_GRACE_S", "20"))
# How often one worker lists a host's containers for orphans (a listing of every container: with
# 200 instances and their standbys, 400 of them; docs/decisions.md "The orphan scan, claimed").
ORPHAN_SCAN_EVERY_S = float(os.environ.get("CONSOLE_ORPHAN_SCAN_EVERY_S", "15"))
# Running instances one worker process follows at most (jobs/runtime/followers.py); the
# pools of the other workers adopt the rest.
# Reconcile stops an instance still running this long after its attempt ended (its decision's
# stop was lost; jobs/runtime/reconcile.py): the decision's own stop comes first.
OUTLIVED_STOP_GRACE_S = float(os.environ.get("CONSOLE_OUTLIVED_STOP_GRACE_S", "10"))
FOLLOWERS_PER_PROCESS = int(os.environ.get("CONSOLE_FOLLOWERS_PER_PROCESS", "1000"))
# A fault-tolerant single-instance job's next container is created while it runs, so that a
# container-level restart is a start (jobs/runtime/standby.py); "0" turns that off.
STANDBY_CONTAINERS = os.environ.get("CONSOLE_STANDBY_CONTAINERS", "1") != "0"
# ... once the attempt has run this long: not in the storm of a start or a restart (the engine is
# busiest then), and not for a run that ends within seconds.
STANDBY_AFTER_S = float(os.environ.get("CONSOLE_STANDBY_AFTER_S", "10"))
# ... and started (armed: its launcher waits for a restart's go), so that a restart is a go and not
# a start: ~60 ms down instead of ~200 ms, for ~14 MB of host memory per job while it runs (the
# engine's shim and the waiting shell). "0": made only, a restart starts it.
STANDBY_ARMED = os.environ.get("CONSOLE_STANDBY_ARMED", "1") != "0"
# Followers' removals of their ended containers (jobs/runtime/engine.py clear_away) one worker
# process asks of one Docker engine at a time; the rest wait their turn (nothing waits for them).
ENGINE_CLEAR_UPS_AT_ONCE = int(os.environ.get("CONSOLE_ENGINE_CLEAR_UPS_AT_ONCE", "8"))
# Browser terminals and SSH relays one user may hold open at once in one web process
# (jobs/session_limits.py).
SESSIONS_PER_USER = int(os.environ.get("CONSOLE_SESSIONS_PER_USER", "8"))
# Job-scoped persistent directories (checkpoints), bind-mounted into every
# attempt's containers: on several hosts, a path they all share (NFS).
JOB_DATA_ROOT = Path(os.environ.get("CONSOLE_JOB_DATA_ROOT", VAR_DIR / "job-data"))
# obs://bucket/path/ maps to <OBJECT_STORAGE_ROOT>/bucket/path (one folder per bucket).
OBJECT_STORAGE_ROOT = Path(os.environ.get("CONSOLE_OBJECT_STORAGE_ROOT", VAR_DIR / "object-storage"))
# JupyterLab and TensorBoard of running instances are served on origins of their own:
# <app>-<job>-<index>.<APPS_DOMAIN> (jobs/proxy/). "localhost": browsers resolve *.localhost to the
# loopback, so it works on one machine as is; elsewhere a wildcard DNS name (and certificate) of
# yours, e.g. apps.console.example. Never the console's own domain or a parent of it.
APPS_DOMAIN = os.environ.get("CONSOLE_APPS_DOMAIN", "localhost")
# Who owns what the console itself writes in object storage (editor saves of new files, log
# exports, code backups): "uid:gid", the operator's mapping. The default is the jobs' user
# (uid 1000), so that a user's own files are writable by their jobs as they are; the console
# never changes the owner of existing data (docs/decisions.md "Mounted data keeps its owner").
STORAGE_OWNER = tuple(int(n) for n in os.environ.get("CONSOLE_STORAGE_OWNER", "1000:1000").split(":", 1))
LOG_ROOT = Path(os.environ.get("CONSOLE_LOG_ROOT", VAR_DIR / "logs"))
# The trusted control channel (jobs/runtime/engine.py): one folder per container, bound at
# /.console/run, written by the launcher (root in the container) and the console only. Like
# JOB_DATA_ROOT, the same path on every Docker host.
CONTROL_ROOT = Path(os.environ.get("CONSOLE_CONTROL_ROOT", VAR_DIR / "control"))
# The console's own tools in every container (/.console/bin, read-only): a static busybox,
# copied from STATIC_BUSYBOX on first use. The same path on every Docker host.
RUNTIME_TOOLS_DIR = Path(os.environ.get("CONSOLE_RUNTIME_TOOLS_DIR", VAR_DIR / "runtime-tools"))
STATIC_BUSYBOX = os.environ.get("CONSOLE_STATIC_BUSYBOX", "/bin/busybox")
# Labels every container this console creates; tests add their own run label.
CONTAINER_LABEL = "console.managed"
CONTAINER_EXTRA_LABELS = dict(
    item.split("=", 1) for item in os.environ.get("CONSOLE_CONTAINER_LABELS", "").split(",") if "=" in item
)
DEFAULT_DOCKER_URL = os.environ.get("CONSOLE_DOCKER_URL", "unix:///var/run/docker.sock")

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.LimitOffsetPagination",
    "PAGE_SIZE": 50,
    "EXCEPTION_HANDLER": "jobs.api.errors.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}

# OpenAPI schema of the v2 API at /api/schema/, Swagger UI at /api/docs/ (drf-spectacular).
SPECTACULAR_SETTINGS = {
    "TITLE": "Training console API",
    "DESCRIPTION": (
        "ModelArts v2-shaped training job API (SPEC §7). Authenticate scripts with "
        "`Authorization: Token <key>`; the browser uses its session. Every object is filtered by what the "
        "caller may see; {project_id} is the workspace's project id."
    ),
    "VERSION": "2",
    "SERVE_INCLUDE_SCHEMA": False,
    "SCHEMA_PATH_PREFIX": r"/v2/",
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "SWAGGER_UI_SETTINGS": {"persistAuthorization": True, "displayOperationId": True},
}

# English is the default (a browser that asks for nothing else gets it); Simplified Chinese for the
# teams coming from ModelArts, whose documents use its terms (locale/zh_Hans/LC_MESSAGES/django.po).
LANGUAGE_CODE = "en"
LANGUAGES = [("en", "English"), ("zh-hans", "简体中文")]
LOCALE_PATHS = [BASE_DIR / "locale"]
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "static"
# Serve from the finders: no collectstatic step for the run command.
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": os.environ.get("CONSOLE_LOG_LEVEL", "INFO")},
    "loggers": {
        "django.channels.server": {"level": "WARNING"},
        "daphne": {"level": "WARNING"},
        # "Task received/succeeded" every few seconds for reconcile: not for the run command's terminal.
        "celery.worker.strategy": {"level": os.environ.get("CONSOLE_TASK_LOG_LEVEL", "WARNING")},
        "celery.app.trace": {"level": os.environ.get("CONSOLE_TASK_LOG_LEVEL", "WARNING")},
    },
}

# Notifications by e-mail go through Django's mail backend (SMTP in production).
EMAIL_BACKEND = os.environ.get("CONSOLE_EMAIL_BACKEND", "django.core.mail.backends.smtp.EmailBackend")
EMAIL_HOST = os.environ.get("CONSOLE_EMAIL_HOST", "127.0.0.1")
EMAIL_PORT = int(os.environ.get("CONSOLE_EMAIL_PORT", "25"))
# A mail server that accepts the connection and never answers must not hold a worker thread (the
# outbox retries what failed; jobs/notify.py).
EMAIL_TIMEOUT = int(os.environ.get("CONSOLE_EMAIL_TIMEOUT_S", "10"))
# Where django.core.mail.backends.filebased.EmailBackend writes messages (one file each).
EMAIL_FILE_PATH = os.environ.get("CONSOLE_EMAIL_FILE_PATH", str(VAR_DIR / "mail"))
DEFAULT_FROM_EMAIL = os.environ.get("CONSOLE_FROM_EMAIL", "training-console@localhost")
# Platform default for the hang-detection window (SPEC §6), and the stable
# window after which "consecutive" restart counters reset (SPEC §4).
HANG_WINDOW_S = int(os.environ.get("CONSOLE_HANG_WINDOW_S", "1800"))
STABLE_WINDOW_S = int(os.environ.get("CONSOLE_STABLE_WINDOW_S", "600"))
# Resource charts (jobs/runtime/resources.py): a point per instance every RESOURCE_SAMPLE_S (one
# stats call to its engine), and each worker process writes the series that changed in one
# statement every RESOURCE_FLUSH_S. Tests shorten both.
RESOURCE_SAMPLE_S = float(os.environ.get("CONSOLE_RESOURCE_SAMPLE_S", "10"))
RESOURCE_FLUSH_S = float(os.environ.get("CONSOLE_RESOURCE_FLUSH_S", "10"))
# Seconds in an "hour" of auto stop and retention (SPEC §3); tests shorten it.
HOUR_S = float(os.environ.get("CONSOLE_HOUR_S", "3600"))
