from __future__ import annotations

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import transaction
from django.db.models import QuerySet
from django.http import Http404, StreamingHttpResponse
from django.shortcuts import get_object_or_404
from django.utils.translation import gettext
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs import listing
from jobs.access import check_quota, visible_job, visible_jobs, workspaces_of
from jobs.goodput import job_goodput, prefetch_goodput_records, recovery_costs
from jobs.listing import JobQuery
from jobs.models import FINAL_PHASES, TaskRun, TrainingJob, Workspace
from jobs.runtime import logreading, metrics, schedule, stop

from . import schema as s
from .representations import event_representation, job_representation, recovery_representation
from .serializers import TrainingJobCreateSerializer


def _workspace(request, project_id: str) -> Workspace:
    return get_object_or_404(workspaces_of(request.user), project_id=project_id)


def _with_rows_shown() -> QuerySet[TrainingJob]:
    """Jobs with the rows job_representation shows (workspace, creator): one query per job."""
    return TrainingJob.objects.select_related("workspace", "created_by")


def _job(request, project_id: str, job_id) -> TrainingJob:
    """The job, in the project's workspace, if the caller may see it (a member of the workspace,
    and the rule of visible_jobs): one query. A project that is not the caller's reads as a job
    that is not there."""
    job = visible_job(request.user, _with_rows_shown(), workspace__project_id=project_id, id=job_id)
    if job is None:
        raise Http404("No such project or job.")
    return job


def _error(status_code: int, errors: dict[str, list[str]]) -> Response:
    field, messages = next(iter(errors.items()))
    return Response(
        {"error_code": f"Console.{status_code}", "error_msg": f"{field}: {messages[0]}", "errors": errors},
        status=status_code,
    )


@extend_schema(tags=[s.TAG])
class TrainingJobList(APIView):
    @extend_schema(
        operation_id="list_training_jobs",
        summary="List the training jobs of a project",
        description="The jobs of the project the caller may see (creator-only jobs of others need "
        '"may list all jobs"), filtered, sorted and paged like the job list page.',
        parameters=s.LIST_PARAMETERS,
        responses={200: OpenApiResponse(s.JOB_LIST), 400: s.BAD_REQUEST, 404: s.NOT_FOUND, **s.AUTH_ERRORS},
        examples=[s.LIST_EXAMPLE],
    )
    def get(self, request, project_id: str):
        workspace = _workspace(request, project_id)
        query, errors = JobQuery.parse(request.query_params)
        if errors:
            return _error(status.HTTP_400_BAD_REQUEST, errors)
        jobs = visible_jobs(request.user).filter(workspace=workspace)
        # The count and the page's ids from the sorted list, then the page's rows with everything the
        # representation reads (jobs.listing.fetch_page, for_api), and their recovery records for
        # status.goodput (one query for the page): the same queries at any size.
        paginator = LimitOffsetPagination()
        ids = paginator.paginate_queryset(query.apply(jobs).values_list("pk", flat=True), request, view=self)
        page = listing.fetch_page(ids, listing.for_api(jobs).prefetch_related(prefetch_goodput_records()))
        return Response(
            {
                "count": paginator.count,
                "limit": paginator.limit,
                "offset": paginator.offset,
                "sort_by": query.sort_by,
                "order": query.order,
                "items": [job_representation(j) for j in page],
            }
        )

    @extend_schema(
        operation_id="create_training_job",
        summary="Create a training job",
        description="Validates the body with the same rules as the wizard, refuses the account's 10,001st job "
        "(quota), saves and queues the job.",
        request={"application/json": s.CREATE_BODY},
        responses={201: OpenApiResponse(s.JOB), 400: s.BAD_REQUEST, 404: s.NOT_FOUND, **s.UNSAFE_AUTH_ERRORS},
        examples=[s.CREATE_EXAMPLE, s.JOB_EXAMPLE, s.QUOTA_EXAMPLE],
    )
    def post(self, request, project_id: str):
        workspace = _workspace(request, project_id)
        serializer = TrainingJobCreateSerializer(
            data=request.data, context={"workspace": workspace, "user": request.user}
        )
        with transaction.atomic():
            try:
                check_quota(request.user)  # locks the account's row until the job is saved
            except DjangoValidationError as exc:
                return _error(status.HTTP_400_BAD_REQUEST, {"quota": exc.messages})
            serializer.is_valid(raise_exception=True)
            job = serializer.save()
            schedule.submit(job)
        job.refresh_from_db()
        return Response(job_representation(job), status=status.HTTP_201_CREATED)


@extend_schema(tags=[s.TAG])
class TrainingJobDetail(APIView):
    @extend_schema(
        operation_id="show_training_job",
        summary="A training job: status.phase, restart counters and the HA settings it runs with",
        responses={200: OpenApiResponse(s.JOB), 404: s.NOT_FOUND, **s.AUTH_ERRORS},
        examples=[s.JOB_EXAMPLE],
    )
    def get(self, request, project_id: str, job_id):
        return Response(job_representation(_job(request, project_id, job_id)))

    @extend_schema(
        operation_id="delete_training_job",
        summary="Delete a finished training job",
        responses={
            204: OpenApiResponse(description="Deleted."),
            404: s.NOT_FOUND,
            409: OpenApiResponse(s.ERROR, description="The job has not ended: terminate it first."),
            **s.UNSAFE_AUTH_ERRORS,
        },
    )
    def delete(self, request, project_id: str, job_id):
        job = _job(request, project_id, job_id)
        if job.phase not in FINAL_PHASES:
            return Response(
                {
                    "error_code": "Console.409",
                    "error_msg": gettext("Job is %(phase)s: terminate it before deleting it.") % {"phase": job.phase},
                },
                status=status.HTTP_409_CONFLICT,
            )
        workspace_id, deleted_id = job.workspace_id, job.id
        with transaction.atomic():
            job.delete()
            # Job lists showing it re-render without it.
            transaction.on_commit(lambda: listing.announce_to_workspace(workspace_id, deleted_id))
        return Response(status=status.HTTP_204_NO_CONTENT)


@extend_schema(tags=[s.TAG])
class TrainingJobActions(APIView):
    @extend_schema(
        operation_id="act_on_training_job",
        summary="Act on a training job (terminate)",
        request={"application/json": s.ACTION_BODY},
        responses={
            202: OpenApiResponse(s.JOB, description="Termination requested."),
            400: s.BAD_REQUEST,
            404: s.NOT_FOUND,
            **s.UNSAFE_AUTH_ERRORS,
        },
        examples=[s.TERMINATE_EXAMPLE],
    )
    def post(self, request, project_id: str, job_id):
        job = _job(request, project_id, job_id)
        action = request.data.get("action_type") if isinstance(request.data, dict) else None
        if action != "terminate":
            return Response(
                {
                    "error_code": "Console.400",
                    "error_msg": gettext('action_type: only "terminate" is supported.'),
                    "errors": {"action_type": [gettext('Only "terminate" is supported.')]},
                },
                status=status.HTTP_400_BAD_REQUEST,
            )
        stop.request_terminate(job.id)
        job = _with_rows_shown().get(id=job.id)
        return Response(job_representation(job), status=status.HTTP_202_ACCEPTED)


@extend_schema(tags=[s.TAG])
class TrainingJobRecoveries(APIView):
    @extend_schema(
        operation_id="list_training_job_recoveries",
        summary="The fault recovery records of a job",
        description="Newest first. Each one's cost to the job's goodput (status.goodput): its downtime, the "
        "work lost since the last checkpoint (when the job reports checkpoints) and their sum, as the Fault "
        "recovery tab shows them.",
        responses={200: OpenApiResponse(s.listing(s.RECOVERY)), 404: s.NOT_FOUND, **s.AUTH_ERRORS},
    )
    def get(self, request, project_id: str, job_id):
        job = _job(request, project_id, job_id)
        records = list(job.recoveries.select_related("failed_attempt", "next_attempt"))
        costs = recovery_costs(job_goodput(job, records), records)
        return Response(
            {"count": len(records), "items": [recovery_representation(r, costs.get(r.id)) for r in records]}
        )


@extend_schema(tags=[s.TAG])
class TrainingJobEvents(APIView):
    @extend_schema(
        operation_id="list_training_job_events",
        summary="The events of a job, newest first",
        parameters=[OpenApiParameter("kind", OpenApiTypes.STR, description="Only events of this kind.")],
        responses={200: OpenApiResponse(s.listing(s.EVENT)), 404: s.NOT_FOUND, **s.AUTH_ERRORS},
    )
    def get(self, request, project_id: str, job_id):
        job = _job(request, project_id, job_id)
        events = job.events.all()
        if kind := request.query_params.get("kind"):
            events = events.filter(kind=kind)
        return Response({"count": events.count(), "items": [event_representation(e) for e in events]})


@extend_schema(tags=[s.TAG])
class TrainingJobMetrics(APIView):
    @extend_schema(
        operation_id="show_training_job_metrics",
        summary="The job's Prometheus metrics, scraped now inside each running instance",
        description="By the job's metrics command or URL (spec.observe.prometheus), run inside each instance "
        "of the current attempt. 404 when the job exposes no metrics.",
        responses={200: OpenApiResponse(s.METRICS), 404: s.NOT_FOUND, **s.AUTH_ERRORS},
    )
    def get(self, request, project_id: str, job_id):
        job = _job(request, project_id, job_id)
        if not job.metrics_mode:
            return Response(
                {
                    "error_code": "Console.404",
                    "error_msg": gettext(
                        "This job exposes no Prometheus metrics (spec.observe.prometheus is not set)."
                    ),
                },
                status=status.HTTP_404_NOT_FOUND,
            )
        return Response({"items": [scrape.as_dict() for scrape in metrics.scrape_job(job)]})


@extend_schema(tags=[s.TAG])
class TrainingJobTaskLogs(APIView):
    @extend_schema(
        operation_id="show_training_job_task_log",
        summary="The log of one instance (task worker-N) across all attempts, as text: whole, or a time range",
        description="With start_time and/or end_time (inclusive; either may be left open) only the lines "
        "logged in that range, where the job has log download by time range on "
        "(spec.log_time_range_download); otherwise 400 naming that setting. 410 once retention deleted "
        "the logs of a job that does not keep them permanently (status.logs says when).",
        parameters=[
            OpenApiParameter("task", OpenApiTypes.STR, OpenApiParameter.PATH, description="worker-0, worker-1, ..."),
            OpenApiParameter(
                "start_time",
                OpenApiTypes.STR,
                description="ISO 8601 date and time (without an offset: the console's time zone) or "
                "milliseconds since the epoch.",
            ),
            OpenApiParameter("end_time", OpenApiTypes.STR, description="Same format as start_time."),
        ],
        responses={
            (200, "text/plain"): OpenApiTypes.STR,
            400: s.BAD_REQUEST,
            404: s.NOT_FOUND,
            410: OpenApiResponse(s.ERROR, description="The logs were deleted by retention."),
            **s.AUTH_ERRORS,
        },
    )
    def get(self, request, project_id: str, job_id, task: str):
        job = _job(request, project_id, job_id)
        try:
            index = int(task.removeprefix("worker-"))
        except ValueError:
            raise Http404("No such task") from None
        if not TaskRun.objects.filter(attempt__job=job, index=index).exists():
            raise Http404("No such task")
        try:
            start_ns, end_ns = logreading.check_log_request(job, request.query_params)
        except logreading.LogRequestRefused as refused:
            return _error(refused.status, {refused.field: [refused.message]})
        lines = logreading.instance_log(job, index, start_ns, end_ns, separators=False)
        return StreamingHttpResponse(lines, content_type="text/plain; charset=utf-8")
