"""Websockets of the job pages (one job, its logs) and of the job list. Authenticated,
filtered like every page (jobs.access.visible_jobs).

Messages from the workers only say what changed; the consumer re-reads the
database or the persisted log and sends HTML fragments that htmx's ws
extension swaps in by id (hx-swap-oob).
"""

from __future__ import annotations

from urllib.parse import parse_qs

from asgiref.sync import async_to_sync
from channels.generic.websocket import WebsocketConsumer
from django.contrib.auth import get_user_model
from django.http import QueryDict
from django.template.loader import render_to_string

from console import realtime

from .access import visible_jobs, workspaces_of
from .models import TaskRun, TrainingJob
from .runtime.logs import LogLine, read_lines
from .views.detail import job_live_fragments
from .views.list import list_rows

LOG_TAIL_LINES = 2000
CLOSE_FORBIDDEN = 4403


class _JobSocket(WebsocketConsumer):
    groups: list[str] = []

    def _job(self) -> TrainingJob | None:
        job_id = self.scope["url_route"]["kwargs"]["job_id"]
        return visible_jobs(self.scope["user"]).filter(id=job_id).first()

    def _refuse(self) -> None:
        # Accept first: a close before accept is a failed handshake (1006 in the
        # browser), which htmx's ws extension retries forever; 4403 it does not.
        self.accept()
        self.close(code=CLOSE_FORBIDDEN)

    def _join(self, group: str) -> None:
        self.group = group
        async_to_sync(self.channel_layer.group_add)(group, self.channel_name)

    def disconnect(self, code) -> None:
        if getattr(self, "group", None):
            async_to_sync(self.channel_layer.group_discard)(self.group, self.channel_name)


class JobConsumer(_JobSocket):
    """Phase, counters, attempts and recovery rows of one job."""

    def connect(self) -> None:
        job = self._job()
        if job is None:
            self._refuse()
            return
        self.job_id = job.id
        self.shown: dict[str, str] = {}  # what this page was last sent, per fragment
        self._join(realtime.job_group(job.id))
        self.accept()
        self.send_fragments()

    def job_changed(self, event) -> None:
        self.send_fragments()

    def send_fragments(self) -> None:
        """Only the fragments that changed since this page's last message: a change of phase
        does not re-send (and re-draw) hundreds of events and captured stacks."""
        job = TrainingJob.objects.filter(id=self.job_id).first()
        if job is None:
            return
        changed = {name: html for name, html in job_live_fragments(job).items() if self.shown.get(name) != html}
        if changed:
            self.shown.update(changed)
            self.send(text_data="".join(changed.values()))


class LogConsumer(_JobSocket):
    """The log of one instance across all attempts: the tail, then live lines.

    Tracks the last line sent per task run, so a push that arrives twice is
    dropped and a gap (a push the channel layer dropped) is filled from the
    persisted file.
    """

    def connect(self) -> None:
        job = self._job()
        if job is None:
            self._refuse()
            return
        self.job_id, self.index = job.id, self.scope["url_route"]["kwargs"]["index"]
        self.sent: dict[int, int] = {}
        # Join first, then read: anything pushed meanwhile is deduplicated.
        self._join(realtime.log_group(job.id, self.index))
        self.accept()
        runs = list(
            TaskRun.objects.filter(attempt__job=job, index=self.index)
            .select_related("attempt")
            .order_by("attempt__number")
        )
        remaining = LOG_TAIL_LINES
        chunks: list[tuple[TaskRun, list[LogLine]]] = []
        for run in reversed(runs):
            lines = read_lines(run, after=max(0, run.log_lines - remaining)) if remaining > 0 else []
            remaining -= len(lines)
            self.sent[run.id] = run.log_lines
            chunks.append((run, lines))
        html = "".join(self._render(run, lines, separator=True) for run, lines in reversed(chunks))
        self.send(text_data=f'<div id="log-lines" hx-swap-oob="innerHTML">{html}</div>')

    def log_lines(self, event) -> None:
        run_id, first = event["task_run"], event["first"]
        separator = run_id not in self.sent
        have = self.sent.get(run_id, 0)
        run = None
        if first > have + 1:
            run = TaskRun.objects.select_related("attempt").get(id=run_id)
            lines = read_lines(run, after=have)
        else:
            lines = [LogLine(first + i, ts, text) for i, (ts, text) in enumerate(event["lines"]) if first + i > have]
        if not lines:
            return
        if separator and run is None:
            run = TaskRun.objects.select_related("attempt").get(id=run_id)
        self.sent[run_id] = lines[-1].number
        html = self._render(run, lines, separator=separator)
        self.send(text_data=f'<div id="log-lines" hx-swap-oob="beforeend">{html}</div>')

    def _render(self, run: TaskRun | None, lines: list[LogLine], separator: bool) -> str:
        return render_to_string(
            "jobs/_log_lines.html", {"run": run, "lines": lines, "separator": separator and run is not None}
        )


class JobListConsumer(WebsocketConsumer):
    """Live rows of the job list: `/ws/jobs/?<the list's query>` (phase, name, sort_by, order, page).

    Joins one group per workspace of the user. A change of a job re-renders the
    page of rows, under the same query, only when the user may see that job now
    or the rows last sent show it (it may have become invisible, or been deleted);
    anything else sends nothing. The user is re-read on every change, so a
    revoked permission or a deactivated account takes effect at once.
    """

    def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            self.accept()  # then 4403, which htmx's ws extension does not retry (see _JobSocket._refuse)
            self.close(code=CLOSE_FORBIDDEN)
            return
        self.user_id = user.pk
        pairs = parse_qs(self.scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        self.params = QueryDict(mutable=True)
        for key, values in pairs.items():
            self.params.setlist(key, values)
        self.groups_joined = [realtime.workspace_group(pk) for pk in workspaces_of(user).values_list("pk", flat=True)]
        for group in self.groups_joined:
            async_to_sync(self.channel_layer.group_add)(group, self.channel_name)
        self.shown: set[str] = set()
        self.accept()
        self.send_rows(user)  # whatever changed between the page's render and this connect

    def disconnect(self, code) -> None:
        for group in getattr(self, "groups_joined", []):
            async_to_sync(self.channel_layer.group_discard)(group, self.channel_name)

    def jobs_changed(self, event) -> None:
        user = get_user_model().objects.filter(pk=self.user_id, is_active=True).first()
        if user is None:
            self.close(code=CLOSE_FORBIDDEN)
            return
        job_id = str(event.get("job_id"))
        if job_id in self.shown or visible_jobs(user).filter(id=job_id).exists():
            self.send_rows(user)

    def send_rows(self, user) -> None:
        html, ids = list_rows(user, self.params)
        self.shown = {str(pk) for pk in ids}
        self.send(text_data=html)
