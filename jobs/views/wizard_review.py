"""The wizard's last step: the configuration grouped by step, and the equivalent REST body."""

from __future__ import annotations

import json

from django import forms
from django.utils.translation import gettext

from jobs import wizard
from jobs.api.representations import request_body
from jobs.models.rules import MASK


def display_value(bound_field) -> str | list[str]:
    """What the user chose, in the words of the page (labels, not codes); "" when nothing."""
    field = bound_field.field
    value = bound_field.value()
    if isinstance(field.widget, forms.CheckboxInput):
        return gettext("On") if value else gettext("Off")
    if bound_field.name == "hang_window_s" and value in (None, "", 0, "0"):
        return gettext("Platform default")
    if value in (None, "", [], ()):
        return ""
    if isinstance(value, list) and value and isinstance(value[0], dict):
        filled = [row for row in value if any(cell not in ("", None, False) for cell in row.values())]
        return [_row_text(bound_field.name, row) for row in filled]
    choices = dict((str(k), label) for k, label in getattr(field, "choices", []) or [] if k not in ("", None))
    if isinstance(value, list | tuple):
        return ", ".join(str(choices.get(str(item), item)) for item in value)
    if getattr(field, "to_field_name", None):  # objects chosen by name: the name is what the user saw
        return str(value)
    return str(choices.get(str(value), value))


def _row_text(name: str, row: dict) -> str:
    if name == "environments":
        shown = MASK if row.get("sensitive") in (True, "on") else row.get("value", "")
        return f"{row.get('name', '')}={shown}"
    if name == "tags":
        return f"{row.get('key', '')}: {row.get('value', '')}"
    return ", ".join(f"{k.replace('_', ' ')} {val}" for k, val in row.items() if val not in ("", None, False))


def review_context(form, visible: set[str], errors: dict[str, list[str]]) -> dict:
    """Either the summary and the body (a valid form), or what still needs fixing, by step."""
    sections = []
    for step in wizard.STEPS:
        if step.slug == wizard.REVIEW:
            continue
        rows = []
        for name in step.fields:
            if name not in visible or name == "env_file":
                continue
            shown = display_value(form[name])
            if shown in ("", []):
                continue
            rows.append({"label": form[name].label, "value": shown, "many": isinstance(shown, list)})
        problems = [
            {"name": name, "messages": errors[name]}
            for name in step.fields
            if name in errors  # a hidden field's message too: it would block the submit unseen
        ]
        sections.append({"step": step, "rows": rows, "problems": problems})
    valid = form.is_bound and not form.errors
    body = ""
    if valid:
        body = json.dumps(request_body(form.instance), indent=2, ensure_ascii=False)
    workspace = form.cleaned_data.get("workspace") if valid else None
    return {
        "sections": sections,
        "valid": valid,
        "body": body,
        "endpoint": f"/v2/{workspace.project_id}/training-jobs" if workspace else "",
        "problem_count": sum(len(s["problems"]) for s in sections),
    }


def job_configuration(job) -> list[dict]:
    """A job's configuration as the wizard's review shows it, grouped by step (the job page's
    Overview). Sensitive env var values are masked; only settings that apply are listed."""
    from jobs.forms import JobCreateForm, copy_initial

    initial = copy_initial(job)
    initial["name"] = job.name
    form = JobCreateForm(user=job.created_by, initial=initial)
    form.fields["workspace"].queryset = type(job.workspace).objects.filter(id=job.workspace_id)
    visible = wizard.visible_fields(lambda name: form[name].value() if name in form.fields else None)
    sections = []
    for step in wizard.STEPS:
        rows = []
        for name in step.fields:
            if name not in visible or name == "env_file":
                continue
            if name == "environments":  # the stored values, masked (copy_initial empties sensitive ones)
                shown = [f"{e['name']}={e['value']}" for e in job.environments_masked()]
            else:
                shown = display_value(form[name])
            if shown in ("", []):
                continue
            rows.append({"label": form[name].label, "value": shown, "many": isinstance(shown, list)})
        if rows:
            sections.append({"step": step, "rows": rows})
    return sections
