#!/usr/bin/env bash
# The run command: installs what is missing (Docker, images, Python packages),
# then serves the console in embedded mode (SQLite, in-process worker, no Redis)
# with demo data. PORT (default 8000) and HOST (default 127.0.0.1) may be set.
set -euo pipefail
cd "$(dirname "$0")"
scripts/setup.sh
unset DATABASE_URL REDIS_URL  # embedded mode; see README for the production mode
PORT="${PORT:-8000}" HOST="${HOST:-127.0.0.1}"
.venv/bin/python manage.py migrate --noinput -v0
demo="$(.venv/bin/python manage.py seed_demo)"
cat <<TXT

  Training console:  http://${HOST}:${PORT}/
  Log in:            $(sed -n 's/^login //p' <<<"$demo")
  Demo project_id:   $(sed -n 's/^project_id //p' <<<"$demo")
  API token:         $(sed -n 's/^api_token //p' <<<"$demo")
  Admin:             http://${HOST}:${PORT}/admin/

TXT
exec .venv/bin/python manage.py embedded --host "$HOST" --port "$PORT"
