from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse, StreamingHttpResponse
from django.shortcuts import render
from django.template.loader import render_to_string
from django.utils import timezone
from django.utils.translation import gettext, ngettext, pgettext_lazy
from django.views.decorators.http import require_POST

from jobs import labels, resource_charts, whatif
from jobs.access import visible_job_or_404
from jobs.goodput import job_goodput
from jobs.models import Attempt, TrainingJob
from jobs.runtime import logreading, metrics, outputs, ssh, stop
from jobs.views.wizard_review import job_configuration

TABS = ("overview", "logs", "recovery", "attempts", "events", "metrics", "resources")
EVENTS_SHOWN = 500  # the Events tab shows the newest ones

# The parts of the job page its websocket re-renders; each carries its own id (out-of-band swap).
LIVE_FRAGMENTS = (
    "jobs/_job_header.html",
    "jobs/_tab_counts.html",
    "jobs/_attempts.html",
    "jobs/_recoveries.html",
    "jobs/_events.html",
)


def job_context(job: TrainingJob) -> dict:
    attempts = list(job.attempts.prefetch_related("task_runs__host").order_by("-number"))
    recoveries = list(
        job.recoveries.select_related("failed_attempt", "next_attempt").prefetch_related(
            "failed_attempt__task_runs__host"
        )
    )
    ordered = sorted(recoveries, key=lambda r: r.detected_at)
    good = job_goodput(job, ordered)
    for record, cost in zip(ordered, good.costs if good else [None] * len(ordered), strict=True):
        _describe_recovery(record, cost)
    events = list(job.events.all()[: EVENTS_SHOWN + 1])
    return {
        "job": job,
        "attempts": attempts,
        "recoveries": recoveries,
        "goodput": _goodput_view(good),
        "whatif": whatif.for_job(job),
        "timeline": build_timeline(job, attempts, recoveries),
        "events": events[:EVENTS_SHOWN],
        "events_truncated": len(events) > EVENTS_SHOWN,
        "event_count": job.events.count() if len(events) > EVENTS_SHOWN else len(events),
        "instances": range(job.node_count),
    }


def job_live_fragments(job: TrainingJob) -> dict[str, str]:
    """The parts of the job page a websocket refreshes, as out-of-band swaps, by template."""
    context = job_context(job) | {"oob": True}
    return {name: render_to_string(name, context) for name in LIVE_FRAGMENTS}


# -- fault recovery rows -------------------------------------------------------------------------
def _goodput_view(good) -> dict | None:
    """The Fault recovery tab's summary: the effective training time ratio and what was lost."""
    if good is None or good.ratio is None:
        return None
    return {
        "percent": f"{good.ratio * 100:.1f}",
        "effective": _duration_text(timedelta(seconds=good.effective_s)),
        "elapsed": _duration_text(timedelta(seconds=good.elapsed_s)),
        "lost": _duration_text(timedelta(seconds=good.lost_s)),
        "recoveries": len(good.costs),
    }


def _describe_recovery(record, cost=None) -> None:
    """What a recovery row shows beyond the record's own fields (cost: its goodput cost)."""
    record.failed_run = next(
        (run for run in record.failed_attempt.task_runs.all() if run.index == record.task_index), None
    )
    # "restart (process level): transient is retryable" -> the level is shown as its own tag.
    reason = record.decision
    for prefix in (f"restart ({record.level} level): ", "end: "):
        if reason.startswith(prefix):
            reason = reason[len(prefix) :]
    record.decision_reason = reason
    evidence = record.evidence or {}
    record.hang = evidence.get("hang") if record.failure_class == "hang" else None
    record.stacks = evidence.get("stacks") or ""
    record.work_lost_steps = evidence.get("work_lost_steps")
    record.downtime_text = _duration_text(record.downtime)
    record.work_lost_text = (
        _duration_text(timedelta(seconds=cost.work_lost_s)) if cost is not None and cost.work_lost_s is not None else ""
    )
    record.time_lost_text = _duration_text(timedelta(seconds=cost.lost_s)) if cost is not None else ""


def _duration_text(delta: timedelta | None) -> str:
    if delta is None:
        return ""
    seconds = max(0.0, delta.total_seconds())
    if seconds < 60:
        return gettext("%(seconds)s s") % {"seconds": f"{seconds:.2f}"}
    minutes, seconds = divmod(round(seconds), 60)
    if minutes < 60:
        return gettext("%(minutes)s min %(seconds)s s") % {"minutes": minutes, "seconds": seconds}
    hours, minutes = divmod(minutes, 60)
    return gettext("%(hours)s h %(minutes)s min") % {"hours": hours, "minutes": minutes}


# -- timeline --------------------------------------------------------------------------------------
# One lane per attempt on a shared time axis, drawn as inline SVG on the server. Horizontal
# positions are percentages of the plot's width, so the picture fills any width without scaling
# its text; vertical ones are pixels.
TICK_STEPS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
MAX_TICKS = 7
AXIS_H = 24


@dataclass
class Segment:
    kind: str  # starting, restarting, running, completed, failed, terminated
    x: float
    w: float
    title: str


@dataclass
class Lane:
    number: int
    level: str
    outcome: str
    y: int
    bar_y: int
    text_y: int
    segments: list[Segment] = field(default_factory=list)


@dataclass
class Marker:
    x: float
    y: int
    y2: int  # where the connector to the next attempt ends (y when none)
    failure_class: str
    title: str


@dataclass
class Tick:
    x: float
    label: str


@dataclass
class Timeline:
    lanes: list[Lane]
    markers: list[Marker]
    ticks: list[Tick]
    row_h: int
    bar_h: int
    height: int
    plot_h: int
    compact: bool
    start: datetime
    end: datetime

    @property
    def label(self) -> str:
        n = len(self.lanes)
        text = ngettext(
            "Timeline of %(count)s attempt from %(start)s to %(end)s",
            "Timeline of %(count)s attempts from %(start)s to %(end)s",
            n,
        )
        return text % {"count": n, "start": _clock(self.start), "end": _clock(self.end)}


# The words of a timeline segment's tooltip, by its kind (the kinds are also CSS classes).
_SEGMENT_WORDS = {
    "starting": pgettext_lazy("timeline", "starting"),
    "restarting": pgettext_lazy("timeline", "restarting"),
    "running": pgettext_lazy("timeline", "running"),
    "ended": pgettext_lazy("timeline", "ended"),
    "completed": pgettext_lazy("timeline", "completed"),
    "failed": pgettext_lazy("timeline", "failed"),
    "terminated": pgettext_lazy("timeline", "terminated"),
}


def _clock(moment: datetime, with_date: bool = False) -> str:
    local = timezone.localtime(moment)
    return local.strftime("%Y-%m-%d %H:%M:%S" if with_date else "%H:%M:%S")


def build_timeline(job: TrainingJob, attempts: list[Attempt], recoveries: list, now: datetime | None = None):
    """Lanes, recovery markers and time ticks of the job's timeline; None before any attempt."""
    if not attempts:
        return None
    now = now or timezone.now()
    ordered = sorted(attempts, key=lambda a: a.number)
    by_id = {a.id: a for a in ordered}
    records_by_failed = {r.failed_attempt_id: r for r in recoveries}

    # Each attempt: [waiting from, running from, until] in time.
    spans = []
    previous_end = None
    for attempt in ordered:
        waiting_from = attempt.created_at
        if previous_end is not None and attempt.level != "initial":
            waiting_from = min(waiting_from, previous_end)
        running_from = attempt.started_at
        until = attempt.ended_at if attempt.state == Attempt.State.ENDED and attempt.ended_at else now
        if running_from is not None:
            until = max(until, running_from)
        spans.append((attempt, waiting_from, running_from, max(until, waiting_from)))
        previous_end = attempt.ended_at or previous_end

    last_attempt = ordered[-1]
    last_record = records_by_failed.get(last_attempt.id)
    waiting_after = bool(
        not job.is_final and last_attempt.state == Attempt.State.ENDED and last_record and last_record.restart
    )
    start = min(s[1] for s in spans)
    end = max(s[3] for s in spans)
    if waiting_after:
        end = max(end, now)
    for record in recoveries:
        end = max(end, record.detected_at)
    span_s = max((end - start).total_seconds(), 0.1)
    end = start + timedelta(seconds=span_s)

    def x(moment: datetime) -> float:
        return round(100 * (moment - start).total_seconds() / span_s, 3)

    count = len(ordered)
    compact = count > 10
    row_h = 26 if count <= 10 else 18 if count <= 40 else 13
    bar_h = 14 if count <= 10 else 10 if count <= 40 else 8
    lanes: list[Lane] = []
    lane_y: dict[int, int] = {}
    for i, (attempt, waiting_from, running_from, until) in enumerate(spans):
        y = i * row_h
        lane = Lane(
            number=attempt.number,
            level=attempt.level,
            outcome=attempt.outcome or attempt.state,
            y=y,
            bar_y=y + (row_h - bar_h) // 2,
            text_y=y + row_h // 2 + 4,
        )
        lane_y[attempt.id] = y + row_h // 2
        if attempt.level != "initial":
            level = labels.label("level", attempt.level)
            name = gettext("Attempt %(number)s (%(level)s level)") % {"number": attempt.number, "level": level}
        else:
            name = gettext("Attempt 1")
        gap_end = running_from or until
        if running_from is None or running_from > waiting_from:
            kind = "starting" if attempt.level == "initial" else "restarting"
            title = gettext("%(name)s: %(kind)s %(start)s – %(end)s (%(took)s)") % {
                "name": name,
                "kind": _SEGMENT_WORDS[kind],
                "start": _clock(waiting_from),
                "end": _clock(gap_end),
                "took": _duration_text(gap_end - waiting_from),
            }
            lane.segments.append(Segment(kind, x(waiting_from), max(x(gap_end) - x(waiting_from), 0.15), title))
        if running_from is not None:
            kind = {
                Attempt.Outcome.SUCCEEDED: "completed",
                Attempt.Outcome.FAILED: "failed",
                Attempt.Outcome.TERMINATED: "terminated",
            }.get(attempt.outcome, "running")
            shown = "ended" if kind == "running" and attempt.state == Attempt.State.ENDED else kind
            ends = gettext("now") if attempt.state != Attempt.State.ENDED else _clock(until)
            title = gettext("%(name)s: %(kind)s, ran %(start)s – %(end)s (%(took)s)") % {
                "name": name,
                "kind": _SEGMENT_WORDS[shown],
                "start": _clock(running_from),
                "end": ends,
                "took": _duration_text(until - running_from),
            }
            lane.segments.append(Segment(kind, x(running_from), max(x(until) - x(running_from), 0.4), title))
        elif attempt.state == Attempt.State.ENDED:  # never ran: could not start, or stopped while starting
            kind = "terminated" if attempt.outcome == Attempt.Outcome.TERMINATED else "failed"
            title = gettext("%(name)s: %(kind)s before it ran (%(at)s)") % {
                "name": name,
                "kind": _SEGMENT_WORDS[kind],
                "at": _clock(until),
            }
            lane.segments.append(Segment(kind, x(until), 0.4, title))
        if attempt is last_attempt and waiting_after:
            title = gettext("Waiting to restart since %(since)s (%(took)s)") % {
                "since": _clock(until),
                "took": _duration_text(now - until),
            }
            lane.segments.append(Segment("restarting", x(until), max(x(now) - x(until), 0.15), title))
        lanes.append(lane)

    markers = []
    for record in sorted(recoveries, key=lambda r: r.detected_at):
        if record.failed_attempt_id not in lane_y:
            continue
        y = lane_y[record.failed_attempt_id]
        nxt = by_id.get(record.next_attempt_id)
        if record.restart:
            decision = gettext("restart, %(level)s level") % {"level": labels.label("level", record.level)}
        else:
            decision = gettext("the job ends")
        title = gettext("%(at)s %(failure_class)s in attempt %(number)s: %(decision)s") % {
            "at": _clock(record.detected_at),
            "failure_class": labels.label("failure_class", record.failure_class),
            "number": by_id[record.failed_attempt_id].number,
            "decision": decision,
        }
        markers.append(
            Marker(
                x=x(record.detected_at),
                y=y,
                y2=lane_y[nxt.id] if nxt is not None else y,
                failure_class=record.failure_class,
                title=title,
            )
        )

    plot_h = count * row_h
    return Timeline(
        lanes=lanes,
        markers=markers,
        ticks=_ticks(start, end, span_s, x),
        row_h=row_h,
        bar_h=bar_h,
        height=plot_h + AXIS_H,
        plot_h=plot_h,
        compact=compact,
        start=start,
        end=end,
    )


def _ticks(start: datetime, end: datetime, span_s: float, x) -> list[Tick]:
    """Clock times at a round step, at most MAX_TICKS of them (and at least 3 for short jobs)."""
    step = next((s for s in TICK_STEPS_S if span_s / s <= MAX_TICKS), None)
    if step is None:
        step = 86400 * (int(span_s // (86400 * MAX_TICKS)) + 1)
    if step <= 1 and span_s / step < 3:
        step = next(s for s in (0.5, 0.2, 0.1) if span_s / s >= 3 or s == 0.1)
    with_date = span_s >= 86400
    ticks = []
    k = math.ceil(start.timestamp() / step)
    while k * step <= end.timestamp():
        at = datetime.fromtimestamp(k * step, tz=start.tzinfo)
        local = timezone.localtime(at)
        if with_date:
            label = local.strftime("%m-%d %H:%M")
        elif step < 1:
            label = local.strftime("%H:%M:%S") + f".{local.microsecond // 100000}"
        else:
            label = local.strftime("%H:%M:%S" if step < 60 else "%H:%M")
        ticks.append(Tick(x(at), label))
        k += 1
    return ticks


@login_required
def job_detail(request, job_id):
    job = visible_job_or_404(request.user, id=job_id)
    tab = request.GET.get("tab", "overview")
    if tab not in TABS:
        raise Http404("No such tab")
    context = job_context(job) | outputs.page_context(job) | {"tab": tab, "instance": _instance(request, job)}
    if tab == "overview":
        context["configuration"] = job_configuration(job)
    if tab == "metrics":
        if not job.metrics_mode:
            raise Http404("This job exposes no Prometheus metrics")
        context["scrapes"] = metrics.scrape_job(job)
    if tab == "resources":
        context |= resource_charts.page_context(job)
    if tab == "attempts" and job.ssh_remote:
        context["ssh_host_key"] = ssh.host_public_key(job)
    if request.htmx and not request.htmx.boosted:
        return render(request, f"jobs/_tab_{tab}.html", context)
    return render(request, "jobs/job_detail.html", context)


def _instance(request, job: TrainingJob) -> int:
    try:
        index = int(request.GET.get("instance", 0))
    except ValueError:
        return 0
    return index if 0 <= index < job.node_count else 0


@login_required
@require_POST
def job_stop(request, job_id):
    job = visible_job_or_404(request.user, id=job_id)
    stop.request_terminate(job.id)
    job.refresh_from_db()
    return render(request, "jobs/_job_header.html", job_context(job))


@login_required
def job_log_download(request, job_id, index):
    """The log of one instance across all attempts, or of a time range (start_time, end_time)
    where the job allows it; 410 once retention deleted the logs."""
    job = visible_job_or_404(request.user, id=job_id)
    try:
        start_ns, end_ns = logreading.check_log_request(job, request.GET)
    except logreading.LogRequestRefused as refused:
        return HttpResponse(refused.message + "\n", status=refused.status, content_type="text/plain; charset=utf-8")
    lines = logreading.instance_log(job, index, start_ns, end_ns)
    response = StreamingHttpResponse(lines, content_type="text/plain; charset=utf-8")
    suffix = "-range" if start_ns is not None or end_ns is not None else ""
    response["Content-Disposition"] = f'inline; filename="{job.name}-worker-{index}{suffix}.log"'
    return response


def healthz(request):
    return HttpResponse("ok", content_type="text/plain")
