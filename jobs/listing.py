"""The job list's query, shared by the list page, the API's list and the list websocket.

Parameters (the same names on the page and in the API):

- ``phase``: one or more phases (repeated, or comma-separated), case-insensitive;
- ``name``: part of the job name, case-insensitive;
- ``sort_by``: ``create_time`` (default) or ``duration``;
- ``order``: ``desc`` (default) or ``asc``.

A job that has not started has no duration; it sorts as zero (first ascending,
last descending). Ties are broken by creation time then id, so pages are stable.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from django.db.models import DurationField, ExpressionWrapper, F, OuterRef, QuerySet, Subquery
from django.db.models.functions import Coalesce, Now
from django.http import QueryDict
from django.utils.translation import gettext

from console import realtime

from .models import ModelVersion, Phase, TrainingJob

# Every relation the API's job representation reads (jobs/api/representations.py and the outputs
# status it includes), joined in the list's one query: one left out costs a query per listed job.
API_RELATED = (
    "workspace",
    "created_by",
    "base_model",
    "preset_template",
    "preset_image",
    "pool",
    "flavor",
    "ssh_key_pair",
    "observe_file_system",
    "publish_model",
    "published_version__model",
)

SORT_BY = ("create_time", "duration")
ORDERS = ("desc", "asc")
PHASES = {str(value).lower(): str(value) for value in Phase.values}


@dataclass
class JobQuery:
    phases: list[str] = field(default_factory=list)
    name: str = ""
    sort_by: str = "create_time"
    order: str = "desc"

    @classmethod
    def parse(cls, params: QueryDict | dict) -> tuple[JobQuery, dict[str, list[str]]]:
        """The query and the errors by parameter (unknown values are dropped from the query)."""
        errors: dict[str, list[str]] = {}
        values = params.getlist("phase") if hasattr(params, "getlist") else [params.get("phase") or ""]
        phases: list[str] = []
        for value in ",".join(values).split(","):
            value = value.strip()
            if not value:
                continue
            known = PHASES.get(value.lower())
            if known is None:
                message = gettext("Unknown phase %(value)s; one of %(phases)s.")
                errors.setdefault("phase", []).append(
                    message % {"value": repr(value), "phases": ", ".join(PHASES.values())}
                )
            elif known not in phases:
                phases.append(known)
        query = cls(phases=phases, name=(params.get("name") or "").strip()[:64])
        sort_by = (params.get("sort_by") or "create_time").strip()
        if sort_by in SORT_BY:
            query.sort_by = sort_by
        else:
            errors["sort_by"] = [gettext("Must be one of %(values)s.") % {"values": ", ".join(SORT_BY)}]
        order = (params.get("order") or "desc").strip().lower()
        if order in ORDERS:
            query.order = order
        else:
            errors["order"] = [gettext("Must be one of %(values)s.") % {"values": ", ".join(ORDERS)}]
        return query, errors

    def apply(self, jobs: QuerySet[TrainingJob]) -> QuerySet[TrainingJob]:
        if self.phases:
            jobs = jobs.filter(phase__in=self.phases)
        if self.name:
            jobs = jobs.filter(name__icontains=self.name)
        descending = self.order == "desc"
        if self.sort_by == "duration":
            jobs = jobs.annotate(
                run_time=ExpressionWrapper(
                    Coalesce(F("ended_at"), Now()) - F("started_at"), output_field=DurationField()
                )
            )
            key = F("run_time").desc(nulls_last=True) if descending else F("run_time").asc(nulls_first=True)
            return jobs.order_by(key, "-created_at", "id")
        if descending:
            return jobs.order_by("-created_at", "-id")
        return jobs.order_by("created_at", "id")

    def params(self) -> dict[str, str]:
        """The non-default parameters, for links and the websocket's URL."""
        out: dict[str, str] = {}
        if self.phases:
            out["phase"] = ",".join(self.phases)
        if self.name:
            out["name"] = self.name
        if self.sort_by != "create_time":
            out["sort_by"] = self.sort_by
        if self.order != "desc":
            out["order"] = self.order
        return out

    def is_filtered(self) -> bool:
        return bool(self.phases or self.name)


def fetch_page(ids: Iterable, jobs: QuerySet[TrainingJob]) -> list[TrainingJob]:
    """The jobs of one page, in the order of `ids`.

    A page is two queries: its ids, from the filtered and sorted list
    (``JobQuery.apply(jobs).values_list("pk", flat=True)``, sliced by the paginator), then its rows
    from `jobs` (the same visible jobs, with the relations the page shows) by primary key. Sorting
    whole rows (a job has about a hundred columns) and their joined relations before cutting the
    page costs tens of milliseconds at the quota (10,000 jobs, SPEC §3); sorting the ids costs a few,
    whatever the sort key (duration is computed, no index serves it). See bench/job_list.py.
    """
    ids = list(ids)
    by_id = {job.pk: job for job in jobs.filter(pk__in=ids).order_by()}
    return [by_id[pk] for pk in ids if pk in by_id]  # one deleted in between is left out


def for_api(jobs: QuerySet[TrainingJob]) -> QuerySet[TrainingJob]:
    """`jobs` with everything job_representation() reads, so a page of the API list costs the same
    queries whatever its size: the relations (API_RELATED) and, for a job that will publish a new
    version of a model, that model's latest version number (`publish_model_latest_number`; the
    representation reads it instead of asking the model, a query per row)."""
    latest = ModelVersion.objects.filter(model=OuterRef("publish_model")).order_by("-number").values("number")[:1]
    return jobs.select_related(*API_RELATED).annotate(publish_model_latest_number=Subquery(latest))


def announce_change(job_id) -> None:
    """Tell the job lists of the job's workspace that it changed (call after the commit).

    The message names the job only: each list consumer checks whether its user
    may see that job before re-rendering anything.
    """
    workspace_id = TrainingJob.objects.filter(id=job_id).values_list("workspace_id", flat=True).first()
    if workspace_id is not None:
        announce_to_workspace(workspace_id, job_id)


def announce_to_workspace(workspace_id, job_id) -> None:
    realtime.publish(realtime.workspace_group(workspace_id), {"type": "jobs.changed", "job_id": str(job_id)})
