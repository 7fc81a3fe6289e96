"""The console's language: Simplified Chinese or English, and a user's remembered choice.

Which language a page is in, first that applies:
1. the user's choice, remembered in their UserPreference row (jobs/models/preferences.py): put in
   the session at login and when they switch, so that it follows them to any browser and costs
   no query per request;
2. the language cookie the header's switcher sets (also for a visitor not logged in);
3. the browser's Accept-Language (LocaleMiddleware);
4. English (settings.LANGUAGE_CODE).

The REST API (/v2/) skips 1: a script states its language with Accept-Language, and its error
messages follow it, whoever the token belongs to.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.signals import user_logged_in
from django.dispatch import receiver
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.utils import translation
from django.utils.translation import gettext
from django.views.decorators.http import require_POST
from django.views.i18n import LANGUAGE_QUERY_PARAMETER
from django.views.i18n import set_language as django_set_language

SESSION_KEY = "console_language"
LANGUAGE_CODES = {code for code, _name in settings.LANGUAGES}
# Paths whose language is the request's own (Accept-Language), not the user's remembered one.
API_PREFIXES = ("/v2/", "/api/")


def supported(code: str | None) -> str | None:
    """The LANGUAGES code for a code or locale a client sent ("zh-Hans", "zh_Hans", "en-US"), or None."""
    if not code:
        return None
    try:
        found = translation.get_supported_language_variant(code.replace("_", "-").lower())
    except LookupError:
        return None
    return found if found in LANGUAGE_CODES else None


def remembered_language(user) -> str | None:
    """The language a user chose with the switcher, or None if they never did."""
    from jobs.models import UserPreference

    if user is None or not user.is_authenticated:
        return None
    return UserPreference.objects.filter(user=user).values_list("language", flat=True).first()


def language_of_scope(scope: dict) -> str:
    """A websocket's language, by the rules of a page (the fragments it sends replace a page's)."""
    session = scope.get("session")
    try:
        chosen = session.get(SESSION_KEY) if session is not None else None
    except Exception:  # a session that cannot be loaded: the socket's other hints still count
        chosen = None
    if supported(chosen):
        return supported(chosen)
    cookies = scope.get("cookies") or {}
    if supported(cookies.get(settings.LANGUAGE_COOKIE_NAME)):
        return supported(cookies.get(settings.LANGUAGE_COOKIE_NAME))
    headers = dict(scope.get("headers") or [])
    accept = headers.get(b"accept-language", b"").decode("latin-1")
    for code, _quality in translation.trans_real.parse_accept_lang_header(accept):
        if code != "*" and supported(code):
            return supported(code)
    return settings.LANGUAGE_CODE


class UserLanguageMiddleware:
    """After LocaleMiddleware: the remembered choice (rule 1) wins over cookie and browser. It also
    sets the cookie to it, so that the login page after a logout stays in the user's language."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        chosen = None
        if hasattr(request, "session") and not request.path_info.startswith(API_PREFIXES):
            chosen = supported(request.session.get(SESSION_KEY))
        if chosen:
            translation.activate(chosen)
            request.LANGUAGE_CODE = chosen
        response = self.get_response(request)
        if chosen and request.COOKIES.get(settings.LANGUAGE_COOKIE_NAME) != chosen:
            if settings.LANGUAGE_COOKIE_NAME not in response.cookies:  # the switcher's answer sets its own
                _set_cookie(response, chosen)
        return response


def _set_cookie(response: HttpResponse, code: str) -> None:
    response.set_cookie(
        settings.LANGUAGE_COOKIE_NAME,
        code,
        max_age=settings.LANGUAGE_COOKIE_AGE,
        path=settings.LANGUAGE_COOKIE_PATH,
        domain=settings.LANGUAGE_COOKIE_DOMAIN,
        secure=settings.LANGUAGE_COOKIE_SECURE,
        httponly=settings.LANGUAGE_COOKIE_HTTPONLY,
        samesite=settings.LANGUAGE_COOKIE_SAMESITE,
    )


@require_POST
def set_language(request: HttpRequest) -> HttpResponse:
    """The header's switcher: Django's set_language (the cookie, the redirect back to `next`),
    limited to the console's languages (Django has catalogs for many more, each of which would
    give half-translated pages), and remembered for a logged-in user."""
    code = supported(request.POST.get(LANGUAGE_QUERY_PARAMETER))
    if code is None:
        choices = ", ".join(sorted(LANGUAGE_CODES))
        return HttpResponseBadRequest(gettext("Unknown language: choose one of %(choices)s.") % {"choices": choices})
    # The cookie holds the console's own code ("zh-hans" for "zh-CN"), as the session does.
    request.POST = request.POST.copy()
    request.POST[LANGUAGE_QUERY_PARAMETER] = code
    response = django_set_language(request)
    if request.user.is_authenticated:
        from jobs.models import UserPreference

        UserPreference.objects.update_or_create(user=request.user, defaults={"language": code})
        request.session[SESSION_KEY] = code
    return response


@receiver(user_logged_in, dispatch_uid="console.language.remember_at_login")
def _remember_at_login(sender, request, user, **kwargs) -> None:
    """Logging in (on any browser) brings the user's choice into the new session."""
    if request is None or not hasattr(request, "session"):
        return
    code = remembered_language(user)
    if code:
        request.session[SESSION_KEY] = code
        translation.activate(code)
    else:
        request.session.pop(SESSION_KEY, None)
