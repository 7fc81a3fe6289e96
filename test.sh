#!/usr/bin/env bash
# The test command: installs and starts what the suite needs (Docker, images,
# PostgreSQL, Redis, Chromium, Python packages), then runs ruff and the suite.
# Extra arguments go to pytest (e.g. ./test.sh tests/test_api.py -x).
set -euo pipefail
cd "$(dirname "$0")"
scripts/setup.sh --test
export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/console}"
export REDIS_URL="${REDIS_URL:-redis://127.0.0.1:6379/9}"
.venv/bin/ruff check .
# Bytecode caches on: without them every worker, daphne and manage.py the tests start compiles the
# project again, and each session rewrites ~450 modules' asserts (collecting: 14.5 s of CPU, 8.9 s with).
unset PYTHONDONTWRITEBYTECODE
# Four test sessions side by side, a file at a time each (every session has its own database,
# worker, daphne, queue and container label: tests/pytest_env.py); the slowest tests are listed.
# Four, not the two CPUs: a session spends much of its time waiting for containers and sockets.
# Not more: with four the CPUs are ~97 % busy already (six: 8:54, four: 8:44-9:11; docs/decisions.md).
.venv/bin/pytest -n "${TEST_SESSIONS:-4}" --dist loadfile --durations=25 "$@"
