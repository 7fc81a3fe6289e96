"""The followers' acknowledgements, written together (jobs/runtime/acks.py): against the test's
real PostgreSQL, from real threads (no Docker)."""

from __future__ import annotations

import threading
import uuid

import pytest
from django.db import DatabaseError, connection
from django.test.utils import CaptureQueriesContext

from jobs.models import Attempt, TaskRun, TrainingJob
from jobs.runtime import acks
from tests.helpers import BUSYBOX

# Transactional: autocommit, as in a worker, where the writer's thread has its own connection.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def writer():
    writer = acks.AckWriter()
    yield writer
    writer.close()  # its thread ends and closes its connection


def followed_runs(demo, count: int) -> list[TaskRun]:
    job = TrainingJob.objects.create(workspace=demo.workspace, created_by=demo.owner, name="acks", image=BUSYBOX)
    attempt = Attempt.objects.create(job=job, number=1)
    return TaskRun.objects.bulk_create(
        TaskRun(attempt=attempt, index=i, host=demo.host, container_name=f"c{i}", follower_token=uuid.uuid4())
        for i in range(count)
    )


def state(lines: int) -> dict:
    return {"lines": lines, "bytes": 10 * lines, "last_ts": 1_000 + lines, "last_ts_count": 1}


def test_one_statement_writes_a_batch_and_a_follower_that_lost_its_run_is_told_so(demo):
    runs = followed_runs(demo, 40)
    batch = [acks._Ack(run.id, run.follower_token, acks._values(state(run.index + 1))) for run in runs]
    batch[7].token = uuid.uuid4()  # another follower holds run 7 now (its heartbeat went stale)
    # A follower that lost run 0 acknowledges in the same batch as the one that holds it now.
    batch.append(acks._Ack(runs[0].id, uuid.uuid4(), acks._values(state(99))))
    with CaptureQueriesContext(connection) as queries:
        acks.write(batch)
    assert len(queries) == 1
    assert [ack.written for ack in batch] == [0 if i in (7, 40) else 1 for i in range(41)]
    assert TaskRun.objects.get(id=runs[0].id).log_lines == 1
    rows = {r.id: r for r in TaskRun.objects.filter(attempt=runs[0].attempt)}
    assert rows[runs[7].id].log_lines == 0 and rows[runs[7].id].follower_heartbeat is None  # not written
    for run in runs[8:]:
        row = rows[run.id]
        assert (row.log_lines, row.log_bytes, row.log_last_ts_ns, row.log_last_ts_count) == (
            run.index + 1,
            10 * (run.index + 1),
            1_001 + run.index,
            1,
        )
        assert row.follower_heartbeat is not None


def test_followers_acknowledging_at_once_share_statements_and_each_gets_its_own_answer(demo, monkeypatch, writer):
    runs = followed_runs(demo, 60)
    sizes: list[int] = []
    write = acks.write

    def counted(batch):  # the real write, its batch sizes counted
        sizes.append(len(batch))
        write(batch)

    monkeypatch.setattr(acks, "write", counted)
    start = threading.Barrier(len(runs))
    answers: dict[int, int] = {}

    def follower(run: TaskRun, token: uuid.UUID) -> None:
        start.wait()
        for lines in range(1, 6):
            answers[run.id] = writer.acknowledge(run.id, token, state(lines))
            if answers[run.id] != 1:
                return
        connection.close()

    stranger = runs[3]
    threads = [
        threading.Thread(target=follower, args=(run, uuid.uuid4() if run is stranger else run.follower_token))
        for run in runs
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert answers == {run.id: 0 if run is stranger else 1 for run in runs}
    assert sum(sizes) == 5 * (len(runs) - 1) + 1
    assert len(sizes) < sum(sizes)  # some acknowledgements shared a statement
    lines = dict(TaskRun.objects.filter(attempt=runs[0].attempt).values_list("id", "log_lines"))
    assert lines == {run.id: 0 if run is stranger else 5 for run in runs}


def test_a_row_the_database_refuses_fails_only_its_own_follower(demo, writer):
    runs = followed_runs(demo, 3)
    batch = [acks._Ack(run.id, run.follower_token, acks._values(state(5))) for run in runs]
    batch[1].values = (-1, *batch[1].values[1:])  # the column's CHECK (>= 0) refuses it: a real IntegrityError
    acks.write_or_isolate(batch)
    assert [ack.written for ack in batch] == [1, 0, 1]
    assert isinstance(batch[1].error, DatabaseError) and batch[0].error is None and batch[2].error is None
    assert [TaskRun.objects.get(id=run.id).log_lines for run in runs] == [5, 0, 5]

    # Through the writer's thread: the follower gets its own error, the others their answers.
    with pytest.raises(acks.AckNotWritten, match="check constraint"):
        writer.acknowledge(runs[1].id, runs[1].follower_token, state(-1))
    assert writer.acknowledge(runs[2].id, runs[2].follower_token, state(6)) == 1


def test_a_batch_whose_statement_fails_by_injection_is_written_row_by_row(demo, monkeypatch, writer):
    runs = followed_runs(demo, 2)
    failed = []

    def failing(batch):  # the batch's statement fails (injected); the rows one by one are real
        failed.append(len(batch))
        raise DatabaseError("injected: the connection broke")

    monkeypatch.setattr(acks, "write", failing)
    assert writer.acknowledge(runs[0].id, runs[0].follower_token, state(1)) == 1
    assert writer.acknowledge(runs[1].id, uuid.uuid4(), state(2)) == 0  # not its run: told so
    assert failed == [1, 1]
    assert TaskRun.objects.get(id=runs[0].id).log_lines == 1


def test_a_writer_whose_thread_ended_starts_another(demo, writer):
    runs = followed_runs(demo, 1)
    assert writer.acknowledge(runs[0].id, runs[0].follower_token, state(1)) == 1
    first = writer._thread
    ended = threading.Thread(target=lambda: None)
    ended.start()
    ended.join()
    writer._thread = ended  # as if the thread had died
    assert writer.acknowledge(runs[0].id, runs[0].follower_token, state(2)) == 1
    second = writer._thread
    assert second is not ended and second.is_alive()
    # Closing ends every thread that waits for work, the replaced one too (a single wake-up
    # once reached only one of them, and the close waited 10 s for the other).
    writer.close()
    first.join(5)
    assert not first.is_alive() and not second.is_alive()


def test_inside_a_transaction_the_acknowledgement_is_the_transactions_own(demo):
    from django.db import transaction

    runs = followed_runs(demo, 1)
    with transaction.atomic():
        TaskRun.objects.filter(id=runs[0].id).update(container_id="made-in-this-transaction")
        # The writer's connection could not see an uncommitted row; this one is written here.
        assert acks.acknowledge(runs[0].id, runs[0].follower_token, state(3)) == 1
        assert TaskRun.objects.get(id=runs[0].id).log_lines == 3


def test_a_log_past_two_billion_lines_is_still_acknowledged(demo, writer):
    """A job may print more than 2^31 lines (a hostile one does it in half an hour): the counts
    are 64-bit, and its follower's acknowledgements go on being written, in a batch or alone."""
    runs = followed_runs(demo, 2)
    past = 2**31 + 7
    assert writer.acknowledge(runs[0].id, runs[0].follower_token, state(past)) == 1
    batch = [acks._Ack(run.id, run.follower_token, acks._values(state(past + run.index))) for run in runs]
    acks.write_or_isolate(batch)
    assert [ack.error for ack in batch] == [None, None] and [ack.written for ack in batch] == [1, 1]
    assert list(
        TaskRun.objects.filter(id__in=[r.id for r in runs]).order_by("index").values_list("log_lines", flat=True)
    ) == [
        past,
        past + 1,
    ]
