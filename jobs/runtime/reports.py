"""What the launcher reported through the control dir (jobs/runtime/engine.py): the only
place the console takes a fact about a container from, besides the engine itself. The
formats are the launcher's (faulttolerance/launcher.py); this reads them from the host.

The job's log may say the same things (the launcher prints them for people, and the job
can print anything); a log line is at most a hint to look here.
"""

from __future__ import annotations

from faulttolerance.launcher import (
    ENV_CHECK_REPORT,
    EnvCheckReport,
    ExitReport,
    exit_report_name,
    parse_env_check_report,
    parse_exit_report,
)
from jobs.models import TaskRun

from . import engine

__all__ = ["EnvCheckReport", "ExitReport", "env_check_report", "exit_report", "exit_report_of"]


def exit_report(job_id, container_name: str, attempt_number: int) -> ExitReport | None:
    """How the user's process of that attempt ended in that container; None while it runs."""
    return parse_exit_report(engine.read_control_file(job_id, container_name, exit_report_name(attempt_number)))


def exit_report_of(task_run: TaskRun) -> ExitReport | None:
    return exit_report(task_run.attempt.job_id, task_run.container_name, task_run.attempt.number)


def env_check_report(job_id, container_name: str) -> EnvCheckReport | None:
    """The verdict of the container's environment checks; None when they did not finish
    (or did not run: fault tolerance off)."""
    return parse_env_check_report(engine.read_control_file(job_id, container_name, ENV_CHECK_REPORT))
