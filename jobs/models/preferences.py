"""A user's own settings that follow them from browser to browser."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils.translation import gettext_lazy as _


class UserPreference(models.Model):
    """The language a user chose with the header's switcher (console/language.py).

    A cookie alone would be forgotten on the next browser; this row is read at login and put in
    the session, so every page of that session is in the chosen language."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="preference")
    language = models.CharField(
        max_length=16, choices=settings.LANGUAGES, verbose_name=_("language"), help_text=_("The console's language.")
    )

    def __str__(self) -> str:
        return f"{self.user} {self.language}"
