"""The followers of one worker process: every running instance it follows, each in a thread
of its own, outside Celery's worker slots.

A follower (follow.follow_task_run) persists its instance's log, watches it for hangs
and hands its end to the supervisor through the database; it lives as long as its
container. Run as Celery tasks they held one worker thread each, so the 33rd running
instance of a 32-thread worker left none for a start, a stop or reconcile. Here they are
threads of a pool that each worker process runs beside Celery (console/celery.py starts it
when the worker is ready), and Celery's threads only ever run short control tasks.

Claiming stays in the database (TaskRun.follower_token / follower_heartbeat, a conditional
UPDATE), so a follower is re-adopted after its process died exactly as before: the pool of
any live worker adopts every running instance whose heartbeat went stale.
"""

from __future__ import annotations

import logging
import threading

from django.conf import settings
from django.db import close_old_connections, connection
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from jobs.models import Attempt, TaskRun

log = logging.getLogger(__name__)

ADOPT_EVERY_S = 1.0


class FollowerPool:
    """Starts a follower thread per running instance this process may follow."""

    def __init__(self, capacity: int | None = None):
        self.capacity = capacity or settings.FOLLOWERS_PER_PROCESS
        self._threads: dict[int, threading.Thread] = {}
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._wake = threading.Event()
        self._loop: threading.Thread | None = None

    # -- the pool's own loop ---------------------------------------------------------------
    def start(self) -> None:
        if self._loop is None:
            self._loop = threading.Thread(target=self._adopt_forever, name="follower-pool", daemon=True)
            self._loop.start()

    def stop(self) -> None:
        self._stopped.set()
        self._wake.set()

    def _adopt_forever(self) -> None:
        while not self._stopped.is_set():
            try:
                self.adopt()
            except Exception:  # a database hiccup: the next round tries again
                log.exception("adopting followers failed")
            finally:
                close_old_connections()
            self._wake.wait(ADOPT_EVERY_S)
            self._wake.clear()

    # -- following -------------------------------------------------------------------------
    def following(self) -> set[int]:
        with self._lock:
            return {run_id for run_id, thread in self._threads.items() if thread.is_alive()}

    def follow(self, task_run_id: int) -> bool:
        """Follow this instance in a thread of its own now (a start just made its container);
        False when this pool follows it already or is full (another pool adopts it)."""
        with self._lock:
            current = self._threads.get(task_run_id)
            if current is not None and current.is_alive():
                return False
            if sum(t.is_alive() for t in self._threads.values()) >= self.capacity:
                return False
            thread = threading.Thread(
                target=self._follow, args=(task_run_id,), name=f"follow-{task_run_id}", daemon=True
            )
            self._threads[task_run_id] = thread
        thread.start()
        return True

    def _follow(self, task_run_id: int) -> None:
        from .follow import follow_task_run

        try:
            follow_task_run(task_run_id)
        except Exception:
            log.exception("following task run %s failed; it will be adopted again", task_run_id)
        finally:
            connection.close()  # this thread's connection: back to the pool, or closed
            with self._lock:
                if self._threads.get(task_run_id) is threading.current_thread():
                    del self._threads[task_run_id]

    def adopt(self) -> int:
        """Running instances nobody follows (a new start, a dead worker's, one this pool was
        full for): start following them here. Returns how many threads were started."""
        stale = timezone.now() - timezone.timedelta(seconds=settings.FOLLOWER_STALE_AFTER_S)
        mine = self.following()
        # A start follows its containers itself (follow_soon) right away; give it that second.
        fresh = timezone.now() - timezone.timedelta(seconds=ADOPT_EVERY_S)
        # A running instance of an ended attempt too: the worker that decided died before it
        # stopped it, with its follower. Reconcile stops it (stop_instances_of_ended_attempts);
        # the follow persists the rest of its log and records its end. Not one whose container a
        # later attempt restarts in: that attempt's run is followed.
        restarted_in_place = TaskRun.later_in_its_container(
            OuterRef("container_id"), OuterRef("attempt__job_id"), OuterRef("attempt__number")
        )
        candidates = (
            TaskRun.objects.filter(state=TaskRun.State.RUNNING)
            .filter(
                Q(attempt__state=Attempt.State.RUNNING)
                | (Q(attempt__state=Attempt.State.ENDED) & ~Exists(restarted_in_place))
            )
            .filter(Q(follower_heartbeat__isnull=True) | Q(follower_heartbeat__lt=stale))
            .exclude(started_at__gt=fresh)
            .exclude(id__in=mine)
            .order_by("id")
            .values_list("id", flat=True)[: max(0, self.capacity - len(mine))]
        )
        return sum(self.follow(task_run_id) for task_run_id in list(candidates))


_pool: FollowerPool | None = None
_pool_lock = threading.Lock()


def local_pool() -> FollowerPool | None:
    """This process's pool, when it runs one (a worker process)."""
    return _pool


def start_local_pool() -> FollowerPool:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = FollowerPool()
            _pool.start()
        return _pool


def follow_soon(task_run_id: int) -> None:
    """A container just started: follow it from this process when it runs a pool, else the
    pool of a worker adopts it within a second."""
    pool = local_pool()
    if pool is not None:
        pool.follow(task_run_id)
