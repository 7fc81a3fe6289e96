"""What a page shows for a stored code: a restart level, a failure class, a run's state.

The codes stay as they are in the database, the API, the page's data attributes and the
English page (where the label is the code itself, as before); a Chinese page shows the words of
the ModelArts console. The `label` template filter (jobs/templatetags/console_i18n.py) reads
these tables; an unknown code is shown as it is.
"""

from __future__ import annotations

from django.utils.translation import pgettext_lazy

TABLES = {
    # faulttolerance/policy.py's levels (Attempt.level, RecoveryRecord.level).
    "level": {
        "initial": pgettext_lazy("restart level", "initial"),
        "process": pgettext_lazy("restart level", "process"),
        "container": pgettext_lazy("restart level", "container"),
        "job": pgettext_lazy("restart level", "job"),
        "reschedule": pgettext_lazy("restart level", "reschedule"),
    },
    # faulttolerance/classify.py's classes (SPEC §4).
    "failure_class": {
        "user_error": pgettext_lazy("failure class", "user_error"),
        "resource_error": pgettext_lazy("failure class", "resource_error"),
        "env_check_failed": pgettext_lazy("failure class", "env_check_failed"),
        "node_failure": pgettext_lazy("failure class", "node_failure"),
        "transient": pgettext_lazy("failure class", "transient"),
        "hang": pgettext_lazy("failure class", "hang"),
        "preempted": pgettext_lazy("failure class", "preempted"),
        "terminated": pgettext_lazy("failure class", "terminated"),
    },
    # TaskRun.State.
    "run_state": {
        "created": pgettext_lazy("instance state", "created"),
        "running": pgettext_lazy("instance state", "running"),
        "exited": pgettext_lazy("instance state", "exited"),
        "start_failed": pgettext_lazy("instance state", "start_failed"),
        "lost": pgettext_lazy("instance state", "lost"),
    },
    # Attempt.Outcome.
    "outcome": {
        "succeeded": pgettext_lazy("attempt outcome", "succeeded"),
        "failed": pgettext_lazy("attempt outcome", "failed"),
        "terminated": pgettext_lazy("attempt outcome", "terminated"),
        "preempted": pgettext_lazy("attempt outcome", "preempted"),
    },
}


def label(table: str, code) -> str:
    """The label of `code` in the active language (the code itself when it has none)."""
    found = TABLES.get(table, {}).get(code)
    return str(found) if found is not None else ("" if code is None else str(code))
