"""Production mode is safe when it starts (README, "Production"): with an operator's database
or broker, DEBUG is off unless asked for, the secret key is the operator's or generated once
(never a fixed string), `check --deploy` is clean behind TLS, and an error page shows nothing
of the configuration."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import requests

ROOT = Path(__file__).resolve().parent.parent


def settings_in(env: dict[str, str], *names: str) -> list[str]:
    """The settings a fresh process reads from this environment (as daphne or a worker would).
    The settings module alone: django.setup() would import every app for nothing (1 s of CPU a call)."""
    code = (
        "import os; os.environ['DJANGO_SETTINGS_MODULE'] = 'console.settings'; "
        "from django.conf import settings; "
        f"print('\\n'.join(str(getattr(settings, n)) for n in {list(names)!r}))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


def production_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DJANGO_")}
    env.update(
        DATABASE_URL="postgres://postgres@127.0.0.1:5432/console",
        REDIS_URL="redis://127.0.0.1:6379/9",
        CONSOLE_VAR_DIR=str(tmp_path / "var"),
        **extra,
    )
    return env


def test_debug_is_off_and_the_secret_key_is_generated_once(tmp_path):
    env = production_env(tmp_path)
    debug, key = settings_in(env, "DEBUG", "SECRET_KEY")
    assert debug == "False"
    key_file = tmp_path / "var" / "secret-key"
    assert key_file.read_text().strip() == key and len(key) >= 50
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert settings_in(env, "SECRET_KEY") == [key]  # kept: sessions survive a restart
    other = production_env(tmp_path / "elsewhere")
    assert settings_in(other, "SECRET_KEY") != [key]  # no fixed string anywhere
    assert settings_in(env | {"DJANGO_DEBUG": "1"}, "DEBUG") == ["True"]  # when asked for
    assert settings_in(env | {"DJANGO_SECRET_KEY": "k" * 60}, "SECRET_KEY") == ["k" * 60]


def test_check_deploy_is_clean_behind_tls(tmp_path):
    env = production_env(tmp_path, DJANGO_SECURE="1", DJANGO_ALLOWED_HOSTS="console.example.com")
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


@pytest.mark.django_db(transaction=True)
def test_an_error_page_shows_nothing_of_the_configuration(demo, live_url):
    """The live daphne runs in production mode (the test run's DATABASE_URL and REDIS_URL)."""
    from django.test import Client

    client = Client()
    client.force_login(demo.owner)
    session = requests.Session()
    session.cookies.set("sessionid", client.cookies["sessionid"].value)
    assert session.get(f"{live_url}/", timeout=10, allow_redirects=False).status_code == 200  # logged in
    for path in ("/jobs/create/?copy=x", "/jobs/00000000-0000-0000-0000-000000000000/", "/no-such-page/"):
        response = session.get(f"{live_url}{path}", timeout=10, allow_redirects=False)
        body = response.text
        assert response.status_code in (200, 302, 400, 404), (path, response.status_code)
        assert "URLconf" not in body and "Traceback" not in body, path  # DEBUG's pages
        assert "postgres://" not in body and "redis://" not in body and "SECRET_KEY" not in body, path
