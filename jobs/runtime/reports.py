"""What the launcher reported through the control dir (jobs/runtime/engine.py): the only
place the console takes a fact about a container from, besides the engine itself.

The job's log may say the same things (the launcher prints them for people, and the job
can print anything); a log line is at most a hint to look here.
"""

from __future__ import annotations

from dataclasses import dataclass

from jobs.models import TaskRun

from . import engine


@dataclass(frozen=True)
class ExitReport:
    code: int
    oom_killed: bool


@dataclass(frozen=True)
class EnvCheckReport:
    passed: bool
    detail: str  # "<item>: <why>" for a failure


def exit_report(job_id, container_name: str, attempt_number: int) -> ExitReport | None:
    """How the user's process of that attempt ended in that container; None while it runs."""
    text = engine.read_control_file(job_id, container_name, f"exit-{attempt_number}")
    if not text:
        return None
    parts = text.split()
    if len(parts) != 2 or not parts[0].isdigit() or parts[1] not in ("0", "1"):
        return None  # not the launcher's format: nothing to take from it
    return ExitReport(int(parts[0]), parts[1] == "1")


def exit_report_of(task_run: TaskRun) -> ExitReport | None:
    return exit_report(task_run.attempt.job_id, task_run.container_name, task_run.attempt.number)


def env_check_report(job_id, container_name: str) -> EnvCheckReport | None:
    """The verdict of the container's environment checks; None when they did not finish
    (or did not run: fault tolerance off)."""
    text = engine.read_control_file(job_id, container_name, "env-check")
    if not text:
        return None
    text = text.strip()
    if text == "pass":
        return EnvCheckReport(True, "")
    if text.startswith("fail "):
        return EnvCheckReport(False, text.removeprefix("fail ")[:500])
    return None
