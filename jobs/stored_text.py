"""Texts the console stores in English, shown in the reader's language.

An event's message, a recovery record's explanation and decision, a job's reason are written
when something happens, often by a worker that serves no one's request, and are kept as English:
the API, webhooks and logs carry them as they are. A page translates such a text when it shows
it: the text is matched against the known templates (jobs/stored_texts.py, one table), the
template found is translated (django.po) and filled with the text's parts, each translated the
same way in turn (a reason inside a decision inside a job's reason). A text that matches no
template (an engine's error, a wording older than the table) is shown as it was stored: nothing
is guessed.
"""

from __future__ import annotations

import functools
import re

from django.utils.translation import get_language, gettext

from . import labels

# Templates fill only %(name)s placeholders: a stored part is text, whatever it was. A placeholder
# named like a table of jobs/labels.py ("failure_class", "level") matches only that table's codes
# and shows its label: "%(failure_class)s: %(decision)s" is not any "something: something".
PLACEHOLDER = re.compile(r"%\((\w+)\)s")
MAX_DEPTH = 4
# A stored text longer than this is shown as it is: the templates' `.+?` placeholders are matched
# against text a job can put in (a path in a start error), and three of them made a 10 kB message
# take 26 s (the growth is cubic). The console's own messages are a few hundred characters.
MAX_TRANSLATED_CHARS = 2048


@functools.cache
def _patterns() -> tuple[tuple[re.Pattern, str], ...]:
    """(pattern, template) of every template, the most literal text first: where two could
    match, the more specific one is meant."""
    from .stored_texts import TEMPLATES

    compiled = []
    for template in dict.fromkeys(TEMPLATES):
        parts, last = [], 0
        for match in PLACEHOLDER.finditer(template):
            parts.append(re.escape(template[last : match.start()].replace("%%", "%")))
            vocabulary = labels.TABLES.get(match[1])
            words = "|".join(re.escape(code) for code in vocabulary) if vocabulary else ".+?"
            parts.append(rf"(?P<{match[1]}>{words})")
            last = match.end()
        parts.append(re.escape(template[last:].replace("%%", "%")))
        literal = len(PLACEHOLDER.sub("", template))
        compiled.append((literal, re.compile("".join(parts), re.DOTALL), template))
    compiled.sort(key=lambda item: -item[0])
    return tuple((pattern, template) for _literal, pattern, template in compiled)


def translate(text, depth: int = 0) -> str:
    """`text` in the active language, when it was built from a known template; else as it is."""
    text = "" if text is None else str(text)
    if not text or len(text) > MAX_TRANSLATED_CHARS or (get_language() or "en").startswith("en"):
        return text
    return _translate(text, get_language(), depth)


@functools.lru_cache(maxsize=4096)
def _translate(text: str, language: str, depth: int) -> str:
    if depth >= MAX_DEPTH:
        return text
    for pattern, template in _patterns():
        match = pattern.fullmatch(text)
        if match is None:
            continue
        if not match.groupdict():
            return gettext(template)
        params = {
            name: labels.label(name, value) if name in labels.TABLES else _translate(value, language, depth + 1)
            for name, value in match.groupdict().items()
        }
        try:
            return gettext(template) % params
        except (KeyError, ValueError, TypeError):  # a translation with other placeholders: keep the English
            return text
    return text
