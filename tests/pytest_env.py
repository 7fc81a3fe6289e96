"""Loaded with -p before pytest-django reads the settings: the test run's
environment. Everything is per test session (pid), so a second session on the
same machine shares nothing with this one but the servers."""

import os
import tempfile

_session = f"t{os.getpid()}"
TMP = tempfile.mkdtemp(prefix=f"console-{_session}-")
# Logs of the worker and daphne stay for a failed run's reader unless it passed
# (see pytest_sessionfinish in conftest.py).

# Each session gets its own database (pytest-django prefixes it with test_),
# so two sessions on one machine never flush each other's tables.
_db = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/console").rstrip("/")
os.environ["DATABASE_URL"] = f"{_db}_{_session}"
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/9")
os.environ["CHANNELS_PREFIX"] = f"console-{_session}"
os.environ["CELERY_QUEUE"] = f"console-{_session}"
os.environ["CONSOLE_VAR_DIR"] = TMP
# STATIC_ROOT (empty: the tests serve static files through the finders): WhiteNoise warns without it.
os.makedirs(os.path.join(TMP, "static"), exist_ok=True)
os.environ["CONSOLE_LOG_ROOT"] = os.path.join(TMP, "logs")
os.environ["CONSOLE_CONTAINER_LABELS"] = f"console.test={_session}"
os.environ.setdefault("CONSOLE_RECONCILE_INTERVAL_S", "2")
os.environ.setdefault("CONSOLE_FOLLOWER_STALE_AFTER_S", "4")
os.environ.setdefault("CONSOLE_ORPHAN_GRACE_S", "6")
os.environ.setdefault("CONSOLE_OUTLIVED_STOP_GRACE_S", "3")
os.environ.setdefault("CONSOLE_LOG_LEVEL", "WARNING")
# Terminals and SSH relays one user may hold open at once (8 in production): a test reaches it.
os.environ.setdefault("CONSOLE_SESSIONS_PER_USER", "3")
# A standby is made a second after its attempt started (10 s in production): tests wait for it.
os.environ.setdefault("CONSOLE_STANDBY_AFTER_S", "1")
# Resource charts: a point every 2 s and a batch write every 2 s (10 s each in production), so a
# test sees a few real points within seconds.
os.environ.setdefault("CONSOLE_RESOURCE_SAMPLE_S", "2")
os.environ.setdefault("CONSOLE_RESOURCE_FLUSH_S", "2")
# Notifications: e-mail into files of this session (the worker inherits this
# environment), and a short retry backoff (0.2, 0.4, ... 3.2 s instead of 2 ... 32 s).
os.environ["CONSOLE_EMAIL_BACKEND"] = "django.core.mail.backends.filebased.EmailBackend"
os.environ["CONSOLE_EMAIL_FILE_PATH"] = os.path.join(TMP, "mail")
os.environ.setdefault("CONSOLE_NOTIFY_BACKOFF_S", "0.2")
# The tests' webhook receivers listen on loopback: allowed, as an operator would allow an
# internal gateway (jobs/outbound.py refuses every other non-public address).
os.environ["CONSOLE_OUTBOUND_ALLOW"] = "127.0.0.1/32"
os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"  # console.settings with a quicker hasher
os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"  # Playwright's sync API beside the ORM

TEST_LABEL = ("console.test", _session)
