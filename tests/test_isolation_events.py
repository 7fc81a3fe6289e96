"""Who is told a host was isolated (jobs/runtime/lifecycle.py `isolate_host`): whichever notices
first, the job whose instance the host lost says why in its events, once. Rows only."""

from __future__ import annotations

import pytest

from jobs.models import EventKind, TrainingJob
from jobs.runtime.lifecycle import isolate_host
from tests.helpers import BUSYBOX

pytestmark = pytest.mark.django_db


def test_a_job_whose_host_the_ping_isolated_first_is_told_once(demo):
    job = TrainingJob(workspace=demo.workspace, created_by=demo.owner, name="lost", image=BUSYBOX, command="true")
    job.full_clean()
    job.save()
    told = job.events.filter(kind=EventKind.HOST_ISOLATED)
    # Reconcile's ping first: the job's run was already marked lost, so no live instance is there.
    assert isolate_host(demo.host.id, "lost connection: ConnectionError")
    assert not told.exists()
    # Then the job's decision (node failure): the host is isolated already; the job is told why.
    assert not isolate_host(demo.host.id, "node failure (lost, attempt 1)", job)
    assert [event.message for event in told] == ["Host local isolated: lost connection: ConnectionError"]
    assert not isolate_host(demo.host.id, "node failure (lost, attempt 2)", job)
    assert told.count() == 1, "once per isolation"
