"""Prometheus metrics of a running job (SPEC §3 "Prometheus metrics"), scraped on demand.

The job exposes them either over HTTP (a URL path and port inside the container) or by a
command that prints the Prometheus text format. Both are run INSIDE the instance's
container with `docker exec` as ma-user: a single-instance job has network mode none,
so its port is reachable only from its own loopback, and the console never needs a
route to the job. Nothing is stored: the Metrics tab and the API scrape when asked.
"""

from __future__ import annotations

import math
import re
import shlex
import time
from dataclasses import dataclass, field

from django.utils.translation import gettext

from jobs.models import TaskRun, TrainingJob

from . import docker_hosts, engine
from .engine import HOST_ERRORS
from .engine_exec import exec_bounded

# SPEC: the command answers "within seconds".
SCRAPE_TIMEOUT_S = 5
MAX_SAMPLES = 1000
MAX_OUTPUT_BYTES = 2 * 1024 * 1024

# Fetches a URL with whatever the image has: wget (busybox), curl, or Python. Every scrape
# runs under the console's own `timeout` (engine_exec.exec_bounded), whatever the image has.
_FETCH = (
    'u="$1"; '
    'if command -v wget >/dev/null 2>&1; then exec wget -q -O - "$u"; '
    f'elif command -v curl >/dev/null 2>&1; then exec curl -sf -m {SCRAPE_TIMEOUT_S} "$u"; '
    "elif command -v python3 >/dev/null 2>&1; then exec python3 -c "
    "'import sys,urllib.request as u;"
    f"sys.stdout.write(u.urlopen(sys.argv[1],timeout={SCRAPE_TIMEOUT_S}).read().decode())' "
    '"$u"; '
    "else echo 'no wget, curl or python3 in the image to fetch the metrics URL' >&2; exit 127; fi"
)


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float

    @property
    def labels_text(self) -> str:
        return ", ".join(f'{k}="{v}"' for k, v in self.labels.items())

    @property
    def value_text(self) -> str:
        if math.isnan(self.value) or math.isinf(self.value):
            return str(self.value)
        return f"{self.value:.6g}"


@dataclass
class Scrape:
    task: str
    ok: bool
    samples: list[Sample] = field(default_factory=list)
    types: dict[str, str] = field(default_factory=dict)
    error: str = ""
    took_ms: int = 0
    truncated: bool = False

    @property
    def rows(self) -> list[tuple[Sample, str]]:
        """Each sample with its metric's TYPE (for the page)."""
        return [(s, self.types.get(s.name, "")) for s in self.samples]

    def as_dict(self) -> dict:
        return {
            "task": self.task,
            "ok": self.ok,
            "error": self.error or None,
            "took_ms": self.took_ms,
            "truncated": self.truncated,
            "samples": [
                {"name": s.name, "labels": s.labels, "value": s.value, "type": self.types.get(s.name)}
                for s in self.samples
            ],
        }


# A sample line, matched in one pass: every quantifier is possessive (Python 3.11), so a line the
# job wrote (up to the scrape's 2 MiB) is never backtracked over. The old pattern took any text in
# braces and then looked for labels in it: `m{` and 40,000 letters took 32 s, holding the GIL.
_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*+"
_LABEL_NAME, _LABEL_VALUE = r"[a-zA-Z_][a-zA-Z0-9_]*+", r'(?:[^"\\]|\\.)*+'
_LABEL = rf'\s*+{_LABEL_NAME}\s*+=\s*+"{_LABEL_VALUE}"\s*+,?+'
_SAMPLE_RE = re.compile(rf"({_NAME})(?:\{{((?:{_LABEL})*+)\s*+\}})?+\s++(\S++)(?:\s++-?\d++)?+\s*+")
# The labels of a sample that matched (the same pattern, with groups): one match after the other
# from the start, each found at once.
_LABEL_RE = re.compile(rf'\s*+({_LABEL_NAME})\s*+=\s*+"({_LABEL_VALUE})"\s*+,?+')
_VALUES = {"+Inf": math.inf, "-Inf": -math.inf, "NaN": math.nan}


def parse(text: str) -> tuple[list[Sample], dict[str, str], list[str]]:
    """The Prometheus text exposition format: (samples, TYPE per metric, problems by line)."""
    samples: list[Sample] = []
    types: dict[str, str] = {}
    problems: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 4 and parts[1] == "TYPE":
                types[parts[2]] = parts[3].strip()
            continue
        match = _SAMPLE_RE.fullmatch(line)
        if not match:
            problems.append(f"line {number} is not a sample: {line[:80]}")
            continue
        name, label_text, raw = match.group(1), match.group(2) or "", match.group(3)
        try:
            value = _VALUES[raw] if raw in _VALUES else float(raw)
        except ValueError:
            problems.append(f"line {number}: {raw!r} is not a number")
            continue
        labels = {k: _unescape(v) for k, v in _LABEL_RE.findall(label_text)}
        samples.append(Sample(name, labels, value))
    return samples, types, problems


def _unescape(value: str) -> str:
    """Label values escape backslash, double quote and newline (and nothing else)."""
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), value)


def scrape_command(job: TrainingJob) -> list[str]:
    """What runs inside the container: the job's command (with its arguments), or a fetch of its URL."""
    if job.metrics_mode == TrainingJob.MetricsMode.COMMAND:
        return [*shlex.split(job.metrics_command), *shlex.split(job.metrics_args)]
    path = job.metrics_path if (job.metrics_path or "").startswith("/") else f"/{job.metrics_path or 'metrics'}"
    return ["sh", "-c", _FETCH, "sh", f"http://127.0.0.1:{job.metrics_port}{path}"]


def scrape(job: TrainingJob, task_run: TaskRun) -> Scrape:
    """Scrape one running instance."""
    task = f"worker-{task_run.index}"
    if task_run.state != TaskRun.State.RUNNING:
        return Scrape(task, False, error=gettext("The instance is not running."))
    started = time.monotonic()
    try:
        container = engine.container(
            task_run.host, task_run.container_id or task_run.container_name, timeout=SCRAPE_TIMEOUT_S + 5
        )
        result = exec_bounded(
            container,
            scrape_command(job),
            user=docker_hosts.MA_USER,
            timeout_s=SCRAPE_TIMEOUT_S,
            max_bytes=MAX_OUTPUT_BYTES,
        )
    except HOST_ERRORS as exc:
        return Scrape(task, False, error=gettext("Could not reach the container: %(error)s") % {"error": exc})
    took_ms = int((time.monotonic() - started) * 1000)
    out, err = result.stdout, result.stderr
    if result.timed_out:
        reason = gettext("no answer within %(seconds)s s") % {"seconds": SCRAPE_TIMEOUT_S}
        return Scrape(task, False, error=_failed(job, reason), took_ms=took_ms)
    if result.exit_code != 0 and not result.truncated:
        reason = err.decode(errors="replace").strip()[-300:] or gettext("exit code %(code)s") % {
            "code": result.exit_code
        }
        return Scrape(task, False, error=_failed(job, reason), took_ms=took_ms)
    samples, types, problems = parse(out.decode(errors="replace"))
    truncated = result.truncated or len(samples) > MAX_SAMPLES
    scrape = Scrape(task, True, samples[:MAX_SAMPLES], types, took_ms=took_ms, truncated=truncated)
    if problems and not samples:
        scrape.ok, scrape.error = False, gettext("Not Prometheus text: %(problem)s") % {"problem": problems[0]}
    elif problems:
        message = gettext("%(count)s line(s) skipped, e.g. %(problem)s")
        scrape.error = message % {"count": len(problems), "problem": problems[0]}
    return scrape


def _failed(job: TrainingJob, reason: str) -> str:
    """Why a scrape failed, in the language of the page or request that asked (scrapes run then)."""
    if job.metrics_mode == TrainingJob.MetricsMode.COMMAND:
        message = gettext("The metrics command '%(command)s' failed: %(reason)s")
        return message % {"command": job.metrics_command, "reason": reason}
    message = gettext("The metrics URL %(url)s failed: %(reason)s")
    return message % {"url": f"http://127.0.0.1:{job.metrics_port}{job.metrics_path}", "reason": reason}


def scrape_job(job: TrainingJob) -> list[Scrape]:
    """Every instance of the job's current attempt (none when the job does not run)."""
    attempt = job.attempts.order_by("-number").first()
    if attempt is None or not job.metrics_mode:
        return []
    runs = attempt.task_runs.select_related("host").order_by("index")
    return [scrape(job, run) for run in runs]
