"""Template filters that show stored English in the page's language.

{{ event.message|stored_text }}     a text the console stored (jobs/stored_text.py)
{{ run.state|label:"run_state" }}   a stored code's label (jobs/labels.py)
{{ code|breakable }}                a code that may wrap after each underscore (a narrow column)
"""

from __future__ import annotations

from django import template
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from jobs import labels, stored_text, whatif

register = template.Library()


@register.filter(name="stored_text")
def stored_text_filter(text) -> str:
    return stored_text.translate(text)


@register.filter(name="label")
def label_filter(code, table: str) -> str:
    return labels.label(table, code)


@register.filter
def breakable(text) -> SafeString:
    """`resource_error` may wrap as `resource_` / `error`, not `resource_e` / `rror`: a line-break
    opportunity after each underscore of the escaped text."""
    return mark_safe(escape(text).replace("_", "_<wbr>"))


@register.filter
def whatif_levels(outcome) -> str:
    return whatif.levels_text(outcome)


@register.filter
def whatif_uses(outcome) -> str:
    return whatif.uses_text(outcome)
