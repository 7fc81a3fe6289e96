"""Websockets of the job pages (one job, its logs) and of the job list. Authenticated,
filtered like every page (jobs.access.visible_jobs).

Messages from the workers only say what changed; the consumer re-reads the
database or the persisted log and sends HTML fragments that htmx's ws
extension swaps in by id (hx-swap-oob).
"""

from __future__ import annotations

import asyncio
import functools
import time
from urllib.parse import parse_qs

from asgiref.sync import async_to_sync
from channels.consumer import SyncConsumer
from channels.db import database_sync_to_async
from channels.exceptions import StopConsumer
from channels.generic.websocket import WebsocketConsumer
from channels.layers import get_channel_layer
from channels.utils import await_many_dispatch
from django.conf import settings
from django.contrib.auth import get_user_model
from django.http import QueryDict
from django.urls import reverse
from django.utils import translation

from console import realtime
from console.language import language_of_scope

from . import logstream
from .access import may_see_job, visible_job, workspaces_of
from .models import TaskRun, TrainingJob
from .views.detail import job_live_fragments
from .views.list import list_rows

LOG_TAIL_LINES = logstream.TAIL_LINES
PACE_S = 1.0  # in a burst, a log page gets lines at most this often
CLOSE_FORBIDDEN = 4403


class _Rechecked(WebsocketConsumer):
    """A socket whose access is checked again every settings.WS_ACCESS_RECHECK_S while it is
    open, traffic or not: a user removed from the workspace or deactivated loses
    the live view within that period (closed with 4403, which htmx does not retry)."""

    async def __call__(self, scope, receive, send) -> None:
        """channels' own (AsyncConsumer.__call__), with a third source of messages: this
        consumer's timers (send_self_later), an in-process queue. Sent through the channel layer,
        a timer was a message like any push: refused by a full channel or expired in it when the
        page fell far behind a burst, and the access rechecks then stopped for good."""
        self.scope = scope
        self.timers: asyncio.Queue = asyncio.Queue()
        self.channel_layer = get_channel_layer(self.channel_layer_alias)
        self.channel_name = await self.channel_layer.new_channel()
        self.channel_receive = functools.partial(self.channel_layer.receive, self.channel_name)
        self.base_send = async_to_sync(send)
        try:
            await await_many_dispatch([receive, self.channel_receive, self.timers.get], self.dispatch)
        except StopConsumer:
            pass

    def allowed(self) -> bool:  # pragma: no cover - each socket says what it needs
        raise NotImplementedError

    def rechecked(self) -> None:
        """After each recheck that kept the socket open: what else the socket renews."""

    @database_sync_to_async
    def dispatch(self, message) -> None:
        """Every handler in the page's language: the fragments sent replace parts of the page.
        An override, not activate(): the handlers of all sockets share the sync threads."""
        if not hasattr(self, "language"):
            self.language = language_of_scope(self.scope)
        with translation.override(self.language):
            SyncConsumer.dispatch.__wrapped__(self, message)

    def start_rechecks(self) -> None:
        self.rechecking = True
        self.send_self_later(settings.WS_ACCESS_RECHECK_S, {"type": "access.check"})

    def access_check(self, event) -> None:
        if not getattr(self, "rechecking", False):
            return
        if not self.allowed():
            self.rechecking = False
            self.close(code=CLOSE_FORBIDDEN)
            return
        self.rechecked()
        self.send_self_later(settings.WS_ACCESS_RECHECK_S, {"type": "access.check"})

    def current_user(self):
        """The socket's user as the database has it now (None: gone or deactivated)."""
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            return None
        return get_user_model().objects.filter(pk=user.pk, is_active=True).first()

    def send_self_later(self, delay: float, message: dict) -> None:
        async_to_sync(self._send_later)(delay, message)

    async def _send_later(self, delay: float, message: dict) -> None:
        """On the server's loop: `message` to this consumer after `delay` seconds, through its
        own timer queue (no thread waits; nothing can refuse it; a consumer that ended never
        reads it)."""
        asyncio.get_running_loop().call_later(delay, self.timers.put_nowait, message)

    def disconnect(self, code) -> None:
        self.rechecking = False


class _JobSocket(_Rechecked):
    groups: list[str] = []

    def _job(self) -> TrainingJob | None:
        job_id = self.scope["url_route"]["kwargs"]["job_id"]
        return visible_job(self.scope["user"], id=job_id)

    def allowed(self) -> bool:
        user = self.current_user()
        return user is not None and may_see_job(user, self.job_id)

    def _refuse(self) -> None:
        # Accept first: a close before accept is a failed handshake (1006 in the
        # browser), which htmx's ws extension retries forever; 4403 it does not.
        self.accept()
        self.close(code=CLOSE_FORBIDDEN)

    def _join(self, group: str) -> None:
        self.group = group
        async_to_sync(self.channel_layer.group_add)(group, self.channel_name)

    def disconnect(self, code) -> None:
        super().disconnect(code)
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
        self.start_rechecks()
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
    """The log of one instance across all attempts: the tail, then live lines (logstream.py).

    Tracks the last record fed per task run, so a push that arrives twice is dropped and a gap
    (pushes the channel layer dropped) is filled from the persisted file, by offset. A trickle
    is sent as it comes; in a burst (BURST_LINES sent within PACE_S) pushes only note how far
    the log goes, and a flush scheduled on the server's loop sends the lines at most every
    PACE_S, catching up from the file: at most the tail, with a "not shown" marker for the
    rest. The work per push is then constant, whatever the job prints. Pushes are hints: every
    recheck brings the page to the persisted end (rechecked), so a push the channel refused or
    let expire, the last ones included, delays lines by a recheck period at most.
    """

    def connect(self) -> None:
        job = self._job()
        if job is None:
            self._refuse()
            return
        self.job_id, self.index = job.id, self.scope["url_route"]["kwargs"]["index"]
        self.download_url = reverse("job-log-download", args=[job.id, self.index])
        # Join first, then read: anything pushed meanwhile is deduplicated.
        self._join(realtime.log_group(job.id, self.index))
        self.accept()
        self.start_rechecks()
        runs = list(
            TaskRun.objects.filter(attempt__job=job, index=self.index)
            .select_related("attempt", "host")
            .order_by("attempt__number")
        )
        self.views = logstream.initial_views(runs, self.download_url)
        html = "".join(view.fragments()[0] for view in self.views.values())
        # Lines sent in the current pace window (PACE_S long): what tells a burst from a trickle.
        self.last_flush = self.window_start = time.monotonic()
        self.sent_lately, self.flush_scheduled = 0, False
        self.send(text_data=f'<div id="log-lines" hx-swap-oob="innerHTML">{html}</div>')

    def log_lines(self, event) -> None:
        run_id = event["task_run"]
        view = self.views.get(run_id)
        if view is None:
            run = TaskRun.objects.select_related("attempt", "host").filter(id=run_id).first()
            if run is None:
                return
            view = self.views[run_id] = logstream.RunView(run, self.download_url)
        records = logstream.push_records(event)
        if records is None:  # a push this consumer cannot read: the file has the records
            records = []
            target = TaskRun.objects.filter(id=run_id).values_list("log_lines", "log_bytes").first() or (0, 0)
        elif not records or records[-1].number <= view.have:
            return  # pushed twice, or skipped past
        else:
            target = (records[-1].number, records[-1].end)
        if self.in_burst():
            # Much was sent just now: note how far the log goes; the scheduled flush catches up
            # from the file (at most the tail), whatever the number of pushes until then.
            view.pending = max(view.pending, target)
            self.schedule_flush()
            return
        view.catch_up(records, *target)
        self.flush()

    def log_flush(self, event) -> None:
        """The scheduled flush of a burst (schedule_flush)."""
        self.flush()

    def rechecked(self) -> None:
        """Every recheck, the page is brought to what the log holds. Pushes are hints: those a
        full channel refused (a page far behind a burst, the job's last pushes among them) or let
        expire are read from the file here, and a run none of whose pushes came gets its view."""
        behind = False
        ends = (
            TaskRun.objects.filter(attempt__job_id=self.job_id, index=self.index)
            .order_by("attempt__number")
            .values_list("id", "log_lines", "log_bytes")
        )
        for run_id, lines, size in ends:
            view = self.views.get(run_id)
            if view is None and lines:
                run = TaskRun.objects.select_related("attempt", "host").filter(id=run_id).first()
                if run is None:
                    continue
                view = self.views[run_id] = logstream.RunView(run, self.download_url)
            if view is not None and lines > max(view.have, view.pending[0]):
                view.pending, behind = (lines, size), True
        if not behind:
            return
        if self.in_burst():
            self.schedule_flush()
        else:
            self.flush()

    def in_burst(self) -> bool:
        since = time.monotonic() - self.last_flush
        if self.flush_scheduled:
            return since < 2 * PACE_S  # a flush late behind a busy loop holds nothing back for long
        return self.sent_lately >= logstream.BURST_LINES and since < PACE_S

    def schedule_flush(self) -> None:
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.send_self_later(max(0.0, self.last_flush + PACE_S - time.monotonic()), {"type": "log.flush"})

    def flush(self) -> None:
        now = time.monotonic()
        if now - self.window_start >= PACE_S:
            self.window_start, self.sent_lately = now, 0
        self.last_flush, self.flush_scheduled = now, False
        appended, replaced = [], []
        for view in self.views.values():
            if view.pending[0] > view.have:
                view.catch_up([], *view.pending)
            added, changed, count = view.fragments()
            appended.append(added)
            replaced.append(changed)
            self.sent_lately += count
        if any(appended) or any(replaced):
            self.send(
                text_data=f'<div id="log-lines" hx-swap-oob="beforeend">{"".join(appended)}</div>{"".join(replaced)}'
            )


class JobListConsumer(_Rechecked):
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
        self.start_rechecks()
        self.send_rows(user)  # whatever changed between the page's render and this connect

    def allowed(self) -> bool:
        return self.current_user() is not None

    def disconnect(self, code) -> None:
        super().disconnect(code)
        for group in getattr(self, "groups_joined", []):
            async_to_sync(self.channel_layer.group_discard)(group, self.channel_name)

    def jobs_changed(self, event) -> None:
        user = get_user_model().objects.filter(pk=self.user_id, is_active=True).first()
        if user is None:
            self.close(code=CLOSE_FORBIDDEN)
            return
        job_id = str(event.get("job_id"))
        if job_id in self.shown or may_see_job(user, job_id):
            self.send_rows(user)

    def send_rows(self, user) -> None:
        html, ids = list_rows(user, self.params)
        self.shown = {str(pk) for pk in ids}
        self.send(text_data=html)
