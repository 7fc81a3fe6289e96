"""A user rotates (or revokes) their own API token in the browser: the old key stops working on
the next request, the new one works, nobody else's token changes, and the page shows the new
key only once."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from rest_framework.authtoken.models import Token

from tests.helpers import api_client

pytestmark = pytest.mark.django_db
PAGE = "/account/token/"


def api_status(demo, key: str) -> int:
    return api_client(key).get(f"/v2/{demo.workspace.project_id}/training-jobs").status_code


def new_key_in(html: str) -> str:
    found = re.search(r'data-testid="new-token">([0-9a-f]{40})<', html)
    assert found, html
    return found.group(1)


def test_rotate_replaces_the_token_at_once(client, demo):
    old = demo.token
    others = Token.objects.exclude(user=demo.owner).values_list("key", flat=True)
    before_others = set(others)
    assert api_status(demo, old) == 200
    client.force_login(demo.owner)
    page = client.get(PAGE).content.decode()
    assert f"…{old[-4:]}" in page and old not in page  # the key itself is never shown again
    response = client.post(PAGE, {"action": "rotate"})
    new = new_key_in(response.content.decode())
    assert new != old
    assert api_status(demo, old) == 401
    assert api_status(demo, new) == 200
    assert set(others) == before_others
    assert new not in client.get(PAGE).content.decode()  # shown once


def test_revoke_leaves_no_token_and_create_makes_one(client, demo):
    client.force_login(demo.owner)
    assert "Revoke token" in client.get(PAGE).content.decode()
    client.post(PAGE, {"action": "revoke"})
    assert not Token.objects.filter(user=demo.owner).exists()
    assert api_status(demo, demo.token) == 401
    page = client.get(PAGE).content.decode()
    assert "You have no token" in page and "Create token" in page
    response = client.post(PAGE, {"action": "rotate"})
    assert api_status(demo, new_key_in(response.content.decode())) == 200


def test_an_unknown_action_changes_nothing(client, demo):
    client.force_login(demo.owner)
    response = client.post(PAGE, {"action": "steal"})
    assert response.status_code == 400 and "Unknown action" in response.content.decode()
    assert Token.objects.get(user=demo.owner).key == demo.token


def test_the_page_needs_a_login_and_a_csrf_token(demo):
    anonymous = Client()
    assert anonymous.post(PAGE, {"action": "rotate"}).status_code == 302  # to the login page
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(demo.owner)
    assert strict.post(PAGE, {"action": "rotate"}).status_code == 403
    assert Token.objects.get(user=demo.owner).key == demo.token
