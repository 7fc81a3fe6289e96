from __future__ import annotations

from django.db import transaction
from django.http import Http404, StreamingHttpResponse
from django.shortcuts import get_object_or_404
from rest_framework import status
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs.access import visible_jobs, workspaces_of
from jobs.models import FINAL_PHASES, TaskRun, TrainingJob, Workspace
from jobs.runtime import lifecycle
from jobs.runtime.logs import read_lines

from .serializers import (
    TrainingJobCreateSerializer,
    event_representation,
    job_representation,
    recovery_representation,
)


def _workspace(request, project_id: str) -> Workspace:
    return get_object_or_404(workspaces_of(request.user), project_id=project_id)


def _job(request, project_id: str, job_id) -> TrainingJob:
    workspace = _workspace(request, project_id)
    return get_object_or_404(
        visible_jobs(request.user).select_related("workspace", "created_by"), workspace=workspace, id=job_id
    )


class TrainingJobList(APIView):
    def get(self, request, project_id: str):
        workspace = _workspace(request, project_id)
        jobs = visible_jobs(request.user).filter(workspace=workspace).select_related("workspace", "created_by")
        if phase := request.query_params.get("phase"):
            jobs = jobs.filter(phase__iexact=phase)
        if name := request.query_params.get("name"):
            jobs = jobs.filter(name__icontains=name)
        paginator = LimitOffsetPagination()
        page = paginator.paginate_queryset(jobs, request, view=self)
        return Response({"count": paginator.count, "items": [job_representation(j) for j in page]})

    def post(self, request, project_id: str):
        workspace = _workspace(request, project_id)
        serializer = TrainingJobCreateSerializer(
            data=request.data, context={"workspace": workspace, "user": request.user}
        )
        serializer.is_valid(raise_exception=True)
        with transaction.atomic():
            job = serializer.save()
            lifecycle.submit(job)
        job.refresh_from_db()
        return Response(job_representation(job), status=status.HTTP_201_CREATED)


class TrainingJobDetail(APIView):
    def get(self, request, project_id: str, job_id):
        return Response(job_representation(_job(request, project_id, job_id)))

    def delete(self, request, project_id: str, job_id):
        job = _job(request, project_id, job_id)
        if job.phase not in FINAL_PHASES:
            return Response(
                {"error_code": "Console.409", "error_msg": f"Job is {job.phase}: terminate it before deleting it."},
                status=status.HTTP_409_CONFLICT,
            )
        job.delete()
        return Response(status=status.HTTP_204_NO_CONTENT)


class TrainingJobActions(APIView):
    def post(self, request, project_id: str, job_id):
        job = _job(request, project_id, job_id)
        action = request.data.get("action_type") if isinstance(request.data, dict) else None
        if action != "terminate":
            return Response(
                {
                    "error_code": "Console.400",
                    "error_msg": 'action_type: only "terminate" is supported.',
                    "errors": {"action_type": ['Only "terminate" is supported.']},
                },
                status=status.HTTP_400_BAD_REQUEST,
            )
        lifecycle.request_terminate(job.id)
        job.refresh_from_db()
        return Response(job_representation(job), status=status.HTTP_202_ACCEPTED)


class TrainingJobRecoveries(APIView):
    def get(self, request, project_id: str, job_id):
        job = _job(request, project_id, job_id)
        records = job.recoveries.select_related("failed_attempt", "next_attempt")
        return Response({"count": records.count(), "items": [recovery_representation(r) for r in records]})


class TrainingJobEvents(APIView):
    def get(self, request, project_id: str, job_id):
        job = _job(request, project_id, job_id)
        events = job.events.all()
        if kind := request.query_params.get("kind"):
            events = events.filter(kind=kind)
        return Response({"count": events.count(), "items": [event_representation(e) for e in events]})


class TrainingJobTaskLogs(APIView):
    def get(self, request, project_id: str, job_id, task: str):
        job = _job(request, project_id, job_id)
        try:
            index = int(task.removeprefix("worker-"))
        except ValueError:
            raise Http404("No such task") from None
        runs = (
            TaskRun.objects.filter(attempt__job=job, index=index).select_related("attempt").order_by("attempt__number")
        )
        if not runs.exists():
            raise Http404("No such task")

        def lines():
            for run in runs:
                for line in read_lines(run):
                    yield line.text + "\n"

        return StreamingHttpResponse(lines(), content_type="text/plain; charset=utf-8")
