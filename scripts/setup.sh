#!/usr/bin/env bash
# Prepare this machine for the console: venv, Docker engine, local job images.
#   scripts/setup.sh          what `runserver` needs
#   scripts/setup.sh --test   plus PostgreSQL, Redis and Chromium for the test suite
#   scripts/setup.sh --notebook  the notebook image alone (JupyterLab, TensorBoard; ~1 min once)
# Idempotent and quick (a few seconds) when everything is already in place.
# stdout stays empty; progress lines go to stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

test_deps=""
case "${1:-}" in
  "") ;;
  --test) test_deps=1 ;;
  --notebook) ensure_venv; ensure_dockerd; ensure_images; ensure_notebook_image; exit 0 ;;
  *) echo "usage: $0 [--test|--notebook]" >&2; exit 2 ;;
esac

ensure_venv
ensure_dockerd
ensure_images
# The run command's demo offers the notebook image, and the suite's notebook test runs it: made
# here (about a minute, once), not inside the suite's time.
ensure_notebook_image
if [[ -n $test_deps ]]; then
  ensure_postgres
  ensure_redis
  # Playwright drives Debian's Chromium headless shell; `playwright install` cannot download here.
  ensure_apt chromium-headless-shell
  # A CJK font for the Chinese pages' screenshots (tests/test_browser_i18n.py), and gettext, whose
  # xgettext/msgfmt check that the translation catalogs match the code (tests/test_i18n_catalog.py).
  ensure_apt fonts-wqy-microhei gettext
  # The tests' browser reaches daphne from a network namespace of its own (tests/browser_network.py):
  # socat forwards, ip makes the namespace, sysctl turns its IPv6 off (nsenter, setpriv: util-linux).
  ensure_apt socat iproute2 procps
fi
log "ok"
