"""The shape and limits of the list-valued fields (env vars, tags), shared by the job and the
preset template; re-exported by rules.py. Messages in the language of the request that checks."""

from __future__ import annotations

from django.utils.translation import gettext as _

from jobs import validators as v


def environment_errors(value) -> list[str]:
    """Env vars: a list of {name, value, sensitive}; at most ENV_MAX; names are unique shell identifiers."""
    if not isinstance(value, list):
        return [_('Env vars must be a list of {"name", "value", "sensitive"}.')]
    if len(value) > v.ENV_MAX:
        return [_("Env vars: at most %(max)s are allowed; got %(count)s.") % {"max": v.ENV_MAX, "count": len(value)}]
    errors, seen = [], set()
    for number, env in enumerate(value, start=1):
        if not isinstance(env, dict) or set(env) - {"name", "value", "sensitive"}:
            errors.append(
                _('Env var %(number)s must be an object with "name", "value" and "sensitive".') % {"number": number}
            )
            continue
        name, val = env.get("name"), env.get("value", "")
        params = {"number": number, "name": name}
        if problem := v.env_name_error(name):
            errors.append(_("Env var %(number)s: %(problem)s.") % {"number": number, "problem": problem})
        elif name in seen:
            errors.append(_("Env var %(number)s: '%(name)s' is set twice; names must be unique.") % params)
        if isinstance(name, str):
            seen.add(name)
        if not isinstance(val, str):
            errors.append(_("Env var %(number)s (%(name)s): the value must be a string.") % params)
        elif len(val) > v.ENV_VALUE_MAX:
            errors.append(
                _("Env var %(number)s (%(name)s): the value may have at most %(max)s characters.")
                % (params | {"max": v.ENV_VALUE_MAX})
            )
        if not isinstance(env.get("sensitive", False), bool):
            errors.append(_("Env var %(number)s (%(name)s): sensitive must be true or false.") % params)
    return errors


def tag_errors(value) -> list[str]:
    if not isinstance(value, list):
        return [_('Tags must be a list of {"key", "value"}.')]
    if len(value) > v.TAGS_MAX:
        return [_("Tags: at most %(max)s are allowed; got %(count)s.") % {"max": v.TAGS_MAX, "count": len(value)}]
    errors, seen = [], set()
    for number, tag in enumerate(value, start=1):
        if not isinstance(tag, dict) or set(tag) - {"key", "value"}:
            errors.append(_('Tag %(number)s must be an object with "key" and "value".') % {"number": number})
            continue
        key, val = tag.get("key"), tag.get("value", "")
        params = {"number": number, "key": key, "rule": v.TAG_RULE}
        if not isinstance(key, str) or not (1 <= len(key) <= v.TAG_KEY_MAX) or key != key.strip():
            errors.append(
                _("Tag %(number)s: the key must be 1-%(max)s characters without surrounding spaces.")
                % {"number": number, "max": v.TAG_KEY_MAX}
            )
        elif not v.TAG_RE.match(key):
            errors.append(_("Tag %(number)s: the key '%(key)s' may contain only %(rule)s.") % params)
        elif key in seen:
            errors.append(_("Tag %(number)s: the key '%(key)s' is used twice; tag keys must be unique.") % params)
        if isinstance(key, str):
            seen.add(key)
        if not isinstance(val, str) or len(val) > v.TAG_VALUE_MAX or not v.TAG_RE.match(val):
            errors.append(
                _("Tag %(number)s (%(key)s): the value must be 0-%(max)s characters of %(rule)s.")
                % (params | {"max": v.TAG_VALUE_MAX})
            )
    return errors
