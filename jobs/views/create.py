"""The create-job wizard (SPEC §3): one page, one form, steps shown one at a time.

Every step's fields live in the one <form>, so going back and forth keeps everything that
was typed; each action (next, back, a step of the indicator, a preset template, a
scenario, an env-file import, review, submit) posts the whole form and gets the wizard
back, swapped in by htmx. Leaving a field posts the form to `validate/` and gets that
field's messages. All validation is JobCreateForm -> TrainingJob.full_clean(), the API's.
"""

from __future__ import annotations

import uuid

from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.db import models as db_models
from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect, QueryDict
from django.shortcuts import render
from django.urls import reverse
from django.utils.translation import gettext
from django.views.decorators.http import require_POST
from django_htmx.http import HttpResponseClientRedirect

from jobs import validators as v
from jobs import whatif, wizard
from jobs.access import visible_job_or_404
from jobs.forms import JobCreateForm, copy_initial, read_env_file
from jobs.models import PresetTemplate, TrainingJob
from jobs.runtime import schedule
from jobs.views.wizard_review import review_context

ACTIONS = ("next", "back", "goto", "apply-template", "apply-scenario", "import-env", "submit")


@login_required
def job_create(request: HttpRequest) -> HttpResponse:
    if request.method != "POST":
        return _start(request)
    action, _, argument = request.POST.get("action", "").partition(":")
    if action not in ACTIONS:
        # A plain POST without the wizard's action (a script, a page without JavaScript): submit.
        return _submit(request, plain=True)
    current = request.POST.get("step") if request.POST.get("step") in wizard.STEP_BY_SLUG else wizard.FIRST_STEP
    if action == "submit":
        return _submit(request)
    data = request.POST.copy()
    notice = ""
    if action == "back":
        return _render(request, _bound(request, data), wizard.previous_step(current))
    if action == "goto":
        target = argument if argument in wizard.STEP_BY_SLUG else current
        if target == wizard.REVIEW:
            return _render(request, _bound(request, data), target, show="all")
        return _render(request, _bound(request, data), target)
    if action == "next":
        form = _bound(request, data)
        form.is_valid()
        if _errors_in_step(form, current):
            return _render(request, form, current, show="step")
        target = wizard.next_step(current)
        return _render(request, form, target, show="all" if target == wizard.REVIEW else "none")
    if action == "apply-template":
        notice = _apply_template(data)
    elif action == "apply-scenario":
        notice = _apply_scenario(data)
    elif action == "import-env":
        form_errors = _import_env(request, data)
        if form_errors:
            form = _bound(request, data)
            return _render(request, form, current, extra_errors={"env_file": form_errors})
        notice = gettext("Env vars imported.")
    return _render(request, _bound(request, data), current, notice=notice)


def _whatif_context(values) -> dict:
    return {"whatif": whatif.for_form_data(_as_post(values)), "whatif_url": reverse("job-create-whatif")}


def _as_post(values) -> dict:
    """Initial values (True, 3) read like posted ones ("on", "3")."""
    return {k: ("on" if values.get(k) is True else values.get(k)) for k in values}


@login_required
@require_POST
def job_create_whatif(request: HttpRequest) -> HttpResponse:
    """The high-availability step's "What happens if" table for the switches as they are now."""
    return render(request, "jobs/_whatif.html", _whatif_context(request.POST))


@login_required
@require_POST
def job_create_validate(request: HttpRequest) -> HttpResponse:
    """One field's messages, as the user leaves it (the whole form is posted: rules span fields)."""
    name = request.GET.get("field", "")
    form = _bound(request, request.POST.copy())
    messages = form.errors.get(name, []) if name in form.fields else []
    return render(request, "jobs/wizard/_errors.html", {"name": name, "errors": messages})


# -- the actions --------------------------------------------------------------------------------------------
def _start(request: HttpRequest) -> HttpResponse:
    """The empty wizard; ?template=, ?scenario= and ?copy=<job id> prefill it."""
    template = None
    if request.GET.get("template"):
        template = PresetTemplate.objects.filter(name=request.GET["template"]).first()
    initial = {}
    notice = ""
    if request.GET.get("copy"):
        try:
            copy_of = uuid.UUID(request.GET["copy"])
        except ValueError:
            raise Http404(gettext("No job with that id.")) from None
        source = visible_job_or_404(request.user, id=copy_of)
        initial = copy_initial(source)
        notice = gettext("Copied from %(name)s.") % {"name": source.name}
        if any(e.get("sensitive") for e in source.environments or []):
            notice += " " + gettext("Sensitive env var values are not copied: enter them again.")
    form = JobCreateForm(user=request.user, template=template, initial=initial)
    scenario = request.GET.get("scenario", "")
    if scenario in wizard.SCENARIO_BY_SLUG:
        form.initial.update(wizard.SCENARIO_BY_SLUG[scenario].values)
        form.initial["scenario"] = scenario
    return _render(request, form, wizard.FIRST_STEP, notice=notice, page=True)


def _submit(request: HttpRequest, *, plain: bool = False) -> HttpResponse:
    form = _bound(request, request.POST if plain else request.POST.copy(), request.FILES if plain else None)
    form.instance.created_by = request.user
    if form.is_valid():
        with transaction.atomic():
            job = form.save()
            schedule.submit(job)
        url = reverse("job-detail", args=[job.id])
        return HttpResponseClientRedirect(url) if request.htmx else HttpResponseRedirect(url)
    first = wizard.first_step_with_errors(form.errors)
    return _render(request, form, first, show="all", status=400, page=not request.htmx)


def _apply_template(data: QueryDict) -> str:
    template = PresetTemplate.objects.select_related("image").filter(name=data.get("preset_template") or "").first()
    if template is None:
        return ""
    values = JobCreateForm.template_initial(template)
    rows = values.pop("environments") or []
    values["preset_image"] = values.get("preset_image") or ""
    wizard.apply_values(data, {k: ("" if val is None else val) for k, val in values.items()})
    wizard.set_rows(data, "environments", rows)
    return gettext("Filled from the preset template %(name)s.") % {"name": template.name}


def _apply_scenario(data: QueryDict) -> str:
    scenario = wizard.SCENARIO_BY_SLUG.get(data.get("scenario") or "")
    if scenario is None:
        return ""
    wizard.apply_values(data, scenario.values)
    message = gettext("High availability set as recommended for %(scenario)s training; see its checklist.")
    return message % {"scenario": str(scenario.title).lower()}


def _import_env(request: HttpRequest, data: QueryDict) -> list[str]:
    """Append the uploaded file's KEY=VALUE lines to the env var rows; all or nothing."""
    upload = request.FILES.get("env_file")
    if upload is None:
        return [gettext("Choose a file of KEY=VALUE lines first.")]
    current = JobCreateForm.base_fields["environments"].to_python(
        JobCreateForm.base_fields["environments"].widget.value_from_datadict(data, None, "environments")
    )
    current = current if isinstance(current, list) else []
    try:
        text = read_env_file(upload)  # at most its cap: a bigger file is refused unread
    except ValidationError as exc:
        return list(exc.messages)
    try:
        rows = v.parse_env_file(text, existing=len(current))
    except Exception as exc:  # ValidationError: the messages say what and which line
        return list(getattr(exc, "messages", [str(exc)]))
    wizard.set_rows(data, "environments", current + rows)
    return []


# -- rendering ----------------------------------------------------------------------------------------------
def _bound(request: HttpRequest, data: QueryDict, files=None) -> JobCreateForm:
    if data._mutable:
        _show_defaults(data)
    form = JobCreateForm(data, files, user=request.user)
    form.instance.created_by = request.user
    return form


def _show_defaults(data: QueryDict) -> None:
    """A hidden field is disabled, so the browser does not post it; when it appears again it
    should show its default (priority 1, not an empty box). Validation is unchanged: the form
    applies these defaults to empty values anyway."""
    for field in TrainingJob._meta.fields:
        if field.name not in JobCreateForm.base_fields or field.name in data:
            continue
        if isinstance(field, db_models.BooleanField) or not field.has_default() or callable(field.default):
            continue
        if field.default not in (None, ""):
            data[field.name] = str(field.default)


def _errors_in_step(form: JobCreateForm, slug: str) -> bool:
    visible = _visible(form)
    return any(name in form.errors for name in wizard.STEP_BY_SLUG[slug].fields if name in visible)


def _visible(form: JobCreateForm) -> set[str]:
    return wizard.visible_fields(lambda name: form[name].value() if name in form.fields else None)


def _render(
    request: HttpRequest,
    form: JobCreateForm,
    current: str,
    *,
    show: str = "none",
    notice: str = "",
    status: int = 200,
    page: bool = False,
    extra_errors: dict[str, list[str]] | None = None,
) -> HttpResponse:
    """The wizard at step `current`. show: whose messages appear: none, the current step's, or all."""
    visible = _visible(form)
    errors: dict[str, list[str]] = {}
    if show != "none" and form.is_bound:
        errors = {name: list(messages) for name, messages in form.errors.items()}
        if show == "step":
            errors = {n: m for n, m in errors.items() if wizard.STEP_OF_FIELD.get(n) == current}
    errors.update(extra_errors or {})
    scenario_slug = form.data.get("scenario") if form.is_bound else form.initial.get("scenario")
    steps = []
    for number, step in enumerate(wizard.STEPS, start=1):
        items = [
            {
                "field": form[name],
                "shown": name in visible,
                "rule": wizard.SHOW_WHEN.get(name, ""),
                "errors": errors.get(name, []),
            }
            for name in step.fields
        ]
        steps.append(
            {
                "step": step,
                "number": number,
                "items": items,
                "current": step.slug == current,
                "has_errors": any(i["errors"] and i["shown"] for i in items),
            }
        )
    context = {
        "form": form,
        "steps": steps,
        "current": current,
        "notice": notice,
        "non_field_errors": errors.get("__all__", []),
        "scenarios": wizard.SCENARIOS,
        "scenario": wizard.SCENARIO_BY_SLUG.get(scenario_slug or ""),
        "templates": _templates(form),
        "template_types": PresetTemplate.Type.choices,
        "is_last_config_step": wizard.next_step(current) == wizard.REVIEW,
        # The scenario checklist's ticks are the user's notes: kept across steps, never saved.
        "checked": [int(k.split("-")[1]) for k in form.data if k.startswith("checklist-") and k[10:].isdigit()]
        if form.is_bound
        else [],
    }
    if current in ("training", wizard.REVIEW):
        context["layout"] = _runtime_layout(form)
    if current == wizard.REVIEW:
        context["review"] = review_context(form, visible, errors)
    if current == "ha":
        context |= _whatif_context(form.data if form.is_bound else form.initial)
    template = "jobs/job_create.html" if page or not request.htmx else "jobs/wizard/_wizard.html"
    response = render(request, template, context, status=status)
    response["HX-Push-Url"] = "false"
    return response


def _runtime_layout(form: JobCreateForm) -> list[dict]:
    """The runtime environment preview (SPEC §3) of what is typed so far, valid or not."""
    if form.is_bound:
        form.is_valid()  # fills form.instance from the posted values (messages stay unshown)
    try:
        return form.instance.runtime_layout()
    except Exception:  # a half-typed value the preview cannot place yet: show nothing rather than fail
        return []


def _templates(form: JobCreateForm):
    """Preset templates for the picker, filtered by type and brand as chosen."""
    data = form.data if form.is_bound else {}
    templates = PresetTemplate.objects.select_related("image").order_by("name")
    brands = sorted({t.brand for t in templates if t.brand})
    chosen_type, chosen_brand = data.get("template_type", ""), data.get("template_brand", "")
    shown = [
        t
        for t in templates
        if (not chosen_type or t.type == chosen_type) and (not chosen_brand or t.brand == chosen_brand)
    ]
    return {"all": templates, "shown": shown, "brands": brands, "type": chosen_type, "brand": chosen_brand}
