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

from dataclasses import dataclass, field

from django.db.models import DurationField, ExpressionWrapper, F, QuerySet
from django.db.models.functions import Coalesce, Now
from django.http import QueryDict

from console import realtime

from .models import Phase, TrainingJob

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
                errors.setdefault("phase", []).append(f"Unknown phase {value!r}; one of {', '.join(PHASES.values())}.")
            elif known not in phases:
                phases.append(known)
        query = cls(phases=phases, name=(params.get("name") or "").strip()[:64])
        sort_by = (params.get("sort_by") or "create_time").strip()
        if sort_by in SORT_BY:
            query.sort_by = sort_by
        else:
            errors["sort_by"] = [f"Must be one of {', '.join(SORT_BY)}."]
        order = (params.get("order") or "desc").strip().lower()
        if order in ORDERS:
            query.order = order
        else:
            errors["order"] = [f"Must be one of {', '.join(ORDERS)}."]
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
