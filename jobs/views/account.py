"""The user's own API token: created, rotated and revoked by its owner in the browser.

A token is a bearer credential for the REST API (rest_framework.authtoken, one per user). Rotating
replaces it at once: the old key stops working on the next request (TokenAuthentication looks the
key up on every request, nothing caches it). The new key is shown once, in the answer to the POST
that made it; the page otherwise shows only when it was made and its last characters.
"""

from __future__ import annotations

import logging

from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils.translation import gettext
from django.views.decorators.http import require_http_methods
from rest_framework.authtoken.models import Token

log = logging.getLogger(__name__)

ACTIONS = {"rotate", "revoke"}


@login_required
@require_http_methods(["GET", "POST"])
def api_token(request: HttpRequest) -> HttpResponse:
    new_key = ""
    error = ""
    if request.method == "POST":
        action = request.POST.get("action", "")
        if action not in ACTIONS:
            error = gettext("Unknown action '%(action)s': rotate or revoke.") % {"action": action[:32]}
        else:
            with transaction.atomic():
                # The user's row is locked first: two rotations at once leave exactly one token.
                get_user_model().objects.select_for_update().filter(pk=request.user.pk).first()
                Token.objects.filter(user=request.user).delete()
                if action == "rotate":
                    new_key = Token.objects.create(user=request.user).key
            log.info("API token of %s: %s", request.user.get_username(), action)
    token = Token.objects.filter(user=request.user).first()
    status = 400 if error else 200
    context = {"token": token, "new_key": new_key, "error": error}
    return render(request, "account/token.html", context, status=status)
