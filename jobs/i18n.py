"""Texts in the language of whoever reads them (console/language.py decides which).

A message made while a request is served is translated there and then: `gettext(...) % {...}`.
A text made once, at import (a rule shown in a help text and inside messages), must wait until
it is shown: `lazy_fill(gettext_lazy(...), name=value)` is the filled template in the language
active when it is turned into a string.
"""

from __future__ import annotations

from django.utils.functional import lazy


def _fill(template, params: dict) -> str:
    return str(template) % {name: str(value) for name, value in params.items()}


_lazy_fill = lazy(_fill, str)


def lazy_fill(template, **params):
    """`template % params`, both translated when the result is shown (params may be lazy too)."""
    return _lazy_fill(template, params)
