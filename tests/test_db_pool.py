"""A thread that waits on the engine gives its pooled database connection back first
(jobs/runtime/dbpool.py): against the test database's real pool and a real socket that takes
the engine's connection and never answers (no Docker). A transaction keeps its connection."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from contextlib import nullcontext

import pytest
from django.db import OperationalError, connection, connections, transaction

from jobs.models import DockerHost
from jobs.runtime import engine
from tests.helpers import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


class Host:
    def __init__(self, base_url: str):
        self.base_url, self.name = base_url, "silent"


@pytest.fixture
def silent_engine(tmp_path):
    """An engine socket that accepts and never answers; `asked` is set once a call connected."""
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(tmp_path / "silent.sock"))
    listener.listen(8)
    asked = threading.Event()
    taken = []

    def accept() -> None:
        while True:
            try:
                taken.append(listener.accept())
            except OSError:
                return
            asked.set()

    threading.Thread(target=accept, daemon=True).start()
    yield Host(f"unix://{tmp_path}/silent.sock"), asked
    listener.close()
    for conn, _ in taken:
        conn.close()


def wait_on_the_engine(host, atomic: bool, wrappers: list, errors: list) -> None:
    """A worker thread's shape: a query, then an engine call (here one that times out)."""
    try:
        with transaction.atomic() if atomic else nullcontext():
            DockerHost.objects.count()
            wrappers.append(connections["default"])  # this thread's own, to be looked at meanwhile
            try:
                engine.ping(host, timeout=3)
            except engine.NoAnswerInTime:
                pass
            DockerHost.objects.count()  # the thread goes on querying after the wait
    except Exception as exc:  # noqa: BLE001 - handed to the test
        errors.append(exc)
    finally:
        connection.close()


def holds_a_connection_while_waiting(host, asked: threading.Event, atomic: bool) -> bool:
    if not connection.settings_dict.get("OPTIONS", {}).get("pool"):
        pytest.skip("the connection pool is PostgreSQL's (DATABASE_URL)")
    wrappers: list = []
    errors: list = []
    waiter = threading.Thread(target=wait_on_the_engine, args=(host, atomic, wrappers, errors))
    waiter.start()
    assert asked.wait(10), "the engine was never asked"
    holds = wrappers[0].connection is not None
    waiter.join(15)
    assert not waiter.is_alive() and not errors, errors
    return holds


def test_a_thread_waiting_on_the_engine_holds_no_database_connection(silent_engine):
    """Before dbpool, Celery's threads kept their connection through slow engine calls: 190
    submissions at once took the worker's pool of 20 for over 30 s (PoolTimeout)."""
    assert not holds_a_connection_while_waiting(*silent_engine, atomic=False)


def test_a_transaction_keeps_its_connection_through_an_engine_call(silent_engine):
    """Giving a connection back in a transaction would end the transaction's work unseen."""
    assert holds_a_connection_while_waiting(*silent_engine, atomic=True)


def test_a_standby_whose_preparation_met_an_injected_database_error_is_prepared_again(monkeypatch):
    """The only one that makes a standby is a task queued once (start.py): a database error (a
    pool taken for its whole timeout) is retried. The error is injected: a pool exhausted for
    30 s is not made in a test."""
    from jobs import tasks
    from jobs.runtime import standby

    calls = []

    def prepare(attempt_id: int) -> bool:
        calls.append(attempt_id)
        if len(calls) == 1:
            raise OperationalError("couldn't get a connection after 30.00 sec")
        return True

    monkeypatch.setattr(standby, "prepare", prepare)
    monkeypatch.setattr(standby, "arm", lambda attempt_id: False)
    assert tasks.prepare_standby.apply(args=(7,)).get() is True
    assert calls == [7, 7]


def test_a_follower_waiting_for_a_clear_up_slot_holds_no_database_connection(settings):
    """The wait for one of an engine's removal slots (engine.clear_away) is a wait at the edge:
    in a terminate storm 200 followers waited there. The containers are stand-ins (what is tested
    is the console's bound and the connection, as in tests/test_engine_clear_ups.py)."""
    from tests.bounded_calls import StandInContainer, tracker

    if not connection.settings_dict.get("OPTIONS", {}).get("pool"):
        pytest.skip("the connection pool is PostgreSQL's (DATABASE_URL)")
    settings.ENGINE_CLEAR_UPS_AT_ONCE = 1
    base_url, seen, hold = f"unix:///slots-{uuid.uuid4()}", tracker(), threading.Event()
    holder = threading.Thread(target=engine.clear_away, args=(StandInContainer(base_url, seen, hold),))
    holder.start()
    # A thread that died (a stand-in that no longer fits the engine's call) fails here, not forever.
    wait_for(lambda: seen["now"] > 0, timeout=10, message="the one slot to be taken")
    wrappers: list = []

    def follower_end() -> None:
        DockerHost.objects.count()
        wrappers.append(connections["default"])
        engine.clear_away(StandInContainer(base_url, seen))
        connection.close()

    waiter = threading.Thread(target=follower_end)
    waiter.start()
    wait_for(lambda: wrappers, timeout=10, message="the follower to hold its connection")
    time.sleep(0.2)  # waiting for the slot now
    assert seen["done"] == 0 and wrappers[0].connection is None
    hold.set()
    for thread in (holder, waiter):
        thread.join(10)
    assert seen["done"] == 2
