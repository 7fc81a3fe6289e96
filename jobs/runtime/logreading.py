"""Reading a job's persisted logs for a person: one instance's log across its attempts, whole
or between two times (a download, the API, the log export), and the checks a log request
passes first (deleted by retention, time ranges allowed, times parsed). Bounded: the ends of a
time range are found by a binary search over the file, the bytes streamed in blocks."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta

from django.utils import timezone
from django.utils.translation import gettext

from jobs import stored_text
from jobs.models import TaskRun, TrainingJob

from . import outputs
from .logrecords import LogLine, iter_raw, iter_records, offset_of_time
from .logs import log_path


def iter_log(task_run: TaskRun, start_ns: int | None = None, end_ns: int | None = None) -> Iterator[LogLine]:
    """The acknowledged records of a task run between two times (inclusive), streamed from the
    file in blocks. Records are in time order (the follower never appends an older one), so
    reading stops at the first record after end_ns."""
    for record in iter_records(log_path(task_run), 0, task_run.log_bytes):
        if end_ns is not None and record.ts_ns > end_ns:
            return
        if start_ns is None or record.ts_ns >= start_ns:
            yield record


def raw_log(task_run: TaskRun, start_ns: int | None = None, end_ns: int | None = None) -> Iterator[bytes]:
    """Exactly the bytes the job printed (logrecords.iter_raw), whole or between two times
    (inclusive): the ends are found by a binary search over the file, the bytes streamed."""
    path, size = log_path(task_run), task_run.log_bytes
    if size <= 0:
        return
    start = 0 if start_ns is None else offset_of_time(path, start_ns, size)
    end = size if end_ns is None else offset_of_time(path, end_ns + 1, size, start)
    yield from iter_raw(path, start, end, size)


def instance_log(
    job: TrainingJob, index: int, start_ns: int | None = None, end_ns: int | None = None, separators: bool = True
) -> Iterator[bytes]:
    """The log of one instance across all attempts, as the bytes its processes printed. A
    separator line names each attempt; within a time range only attempts with output in it
    get one; a separator after output that did not end with a newline starts a line of its own."""
    runs = TaskRun.objects.filter(attempt__job=job, index=index).select_related("attempt", "host")
    ranged = start_ns is not None or end_ns is not None
    ends_line = True
    for run in runs.order_by("attempt__number"):
        host = run.host.name if run.host_id else ""
        header = f"# attempt {run.attempt.number} on {host}, container {run.container_name}\n".encode()
        first = True
        for chunk in raw_log(run, start_ns, end_ns):
            if first and separators:
                yield header if ends_line else b"\n" + header
            first = False
            ends_line = chunk.endswith(b"\n")
            yield chunk
        if first and separators and not ranged:
            yield header if ends_line else b"\n" + header
            ends_line = True


_NS_MAX = 2**63 - 1  # the largest ns stamp a log line can carry (PostgreSQL's bigint)


class LogRequestRefused(Exception):
    """A log download the job does not allow: status 410 (deleted) or 400 (time range)."""

    def __init__(self, status: int, field: str, message: str):
        super().__init__(message)
        self.status, self.field, self.message = status, field, message


def deleted_message(job: TrainingJob) -> str:
    # Shown when asked for (a page, a download, the API): in the language of that request.
    return gettext(
        "The logs of this job were deleted by retention on %(when)s: without keep logs permanently, logs are "
        "kept %(retention)s after the job ends."
    ) % {
        "when": outputs.when_text(job.logs_deleted_at),
        "retention": stored_text.translate(outputs.duration_text(outputs.log_retention_s())),
    }


def check_log_request(job: TrainingJob, params: Mapping[str, str]) -> tuple[int | None, int | None]:
    """The time range (ns, either end may be open) a log download asks for, or why it is refused:
    the logs were deleted (410), a range on a job without log download by time range, or a
    range that is not one (400). No start_time/end_time: the whole log."""
    if job.logs_deleted_at:
        raise LogRequestRefused(410, "logs", deleted_message(job))
    raw_start = (params.get("start_time") or "").strip()
    raw_end = (params.get("end_time") or "").strip()
    if not (raw_start or raw_end):
        return None, None
    if not job.log_time_range_download:
        raise LogRequestRefused(
            400,
            outputs.TIME_RANGE_SETTING,
            gettext(
                "Log download by time range is off for this job (setting %(setting)s): download the whole log instead."
            )
            % {"setting": outputs.TIME_RANGE_SETTING},
        )
    start_ns = parse_time(raw_start, "start_time") if raw_start else None
    end_ns = parse_time(raw_end, "end_time", end=True) if raw_end else None
    if start_ns is not None and end_ns is not None and end_ns < start_ns:
        raise LogRequestRefused(400, "end_time", "end_time must not be before start_time.")
    return start_ns, end_ns


def parse_time(value: str, name: str, *, end: bool = False) -> int:
    """ISO 8601 (without an offset: the console's time zone, as the page shows times) or
    milliseconds since the epoch (as the API's create_time) -> ns since the epoch.

    Lines carry ns timestamps, a time given by hand is coarser: an end (end=True) takes in
    the whole unit it names, so "to 14:05:00" includes the lines of 14:05:00.7 and a range
    from and to one line's time as shown returns that line."""
    if value.isascii() and value.isdigit():  # not '²', which isdigit() takes and int() refuses
        # Past what a line's ns stamp (a bigint) can hold is the end of time for every line; 20
        # digits and more are never read as a number (int() refuses 4,300).
        digits = value.lstrip("0") or "0"
        ns = int(digits) * 1_000_000 + (999_999 if end else 0) if len(digits) < 20 else _NS_MAX
        return min(ns, _NS_MAX)
    try:
        moment = datetime.fromisoformat(value.replace(" ", "T", 1))
    except ValueError:
        raise LogRequestRefused(
            400,
            name,
            f"{name} must be a date and time (ISO 8601, e.g. 2026-11-29T14:05:00Z) or milliseconds "
            f"since the epoch; got '{value[:64]}'.",
        ) from None
    if timezone.is_naive(moment):
        moment = timezone.make_aware(moment)
    # Whole microseconds: exact, where float seconds would round a line's ns timestamp.
    ns = (moment - EPOCH) // timedelta(microseconds=1) * 1000
    return max(-_NS_MAX, min(ns + (_unit_ns(value) - 1 if end else 0), _NS_MAX))


def _unit_ns(value: str) -> int:
    """The precision of an ISO time as written: a day, minute, second or a fraction of one."""
    clock = value.replace(" ", "T", 1).partition("T")[2]
    if not clock:
        return 86400 * 1_000_000_000
    clock = clock.rstrip("Z").split("+")[0].split("-")[0]
    if "." in clock or "," in clock:
        digits = min(len(clock.replace(",", ".").partition(".")[2]), 9)
        return 10 ** (9 - digits)
    return 1_000_000_000 if clock.count(":") >= 2 else 60_000_000_000


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
