#!/usr/bin/env bash
# The translation catalogs (locale/zh_Hans/LC_MESSAGES/django.po and djangojs.po, Django's i18n).
#   scripts/messages.sh            update the .po files from the marked texts of the code (gettext,
#                                  {% translate %}, gettext() in static/console/*.js): new texts come
#                                  in untranslated, texts no longer used go; translations are kept
#   scripts/messages.sh --compile  write the .mo files Django reads from the .po files
# The .mo files are committed, so that the run command needs no gettext tools; tests/test_i18n_catalog.py
# fails when a text has no translation, or a .po or .mo file is behind the code. Needs gettext (apt).
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-.venv/bin/python}"
ignore=(--ignore='var/*' --ignore='test-artifacts/*' --ignore='tests/*' --ignore='bench/*' --ignore='examples/*'
  --ignore='static/vendor/*' --ignore='locale/*' --ignore='docs/*' --ignore='scripts/*')
case "${1:-}" in
  "")
    "$python" manage.py makemessages -l zh_Hans --no-obsolete "${ignore[@]}" -v0
    "$python" manage.py makemessages -d djangojs -l zh_Hans --no-obsolete "${ignore[@]}" -v0
    ;;
  --compile) "$python" manage.py compilemessages -l zh_Hans "${ignore[@]}" -v0 ;;
  *) echo "usage: $0 [--compile]" >&2; exit 2 ;;
esac
