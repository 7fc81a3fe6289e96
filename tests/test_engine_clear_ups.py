"""A follower's removal of its ended container is bounded per engine (jobs/runtime/engine.py
clear_away); any other removal (a control task's, the one a restart waits for) is not. Unit
tests: the containers are stand-ins that record how many removals run at once (what is tested
is the console's bound, not Docker: the terminate storm against the real engine is
bench/terminate_storm.py)."""

from __future__ import annotations

import threading
import time
import uuid

from jobs.runtime import engine
from tests.bounded_calls import StandInContainer, tracker


def run_all(targets) -> None:
    threads = [threading.Thread(target=t) for t in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)


def test_clear_ups_of_one_engine_run_a_few_at_a_time_and_all_complete(settings):
    settings.ENGINE_CLEAR_UPS_AT_ONCE = 3
    seen = tracker()
    url = f"unix://stand-in-{uuid.uuid4()}"
    containers = [StandInContainer(url, seen) for _ in range(12)]
    run_all([lambda c=c: engine.clear_away(c) for c in containers])
    assert seen["done"] == 12
    assert seen["most"] == 3


def test_each_engine_has_its_own_slots(settings):
    settings.ENGINE_CLEAR_UPS_AT_ONCE = 2
    seen = tracker()
    urls = [f"unix://stand-in-{uuid.uuid4()}" for _ in range(3)]
    containers = [StandInContainer(url, seen) for url in urls for _ in range(4)]
    run_all([lambda c=c: engine.clear_away(c) for c in containers])
    assert seen["done"] == 12
    assert 2 < seen["most"] <= 6  # two per engine, three engines


def test_the_removal_a_restart_waits_for_takes_no_slot(settings):
    """Every slot held by a slow clear-up: a plain remove_container (a refused standby, on a
    restart's path) still runs at once."""
    settings.ENGINE_CLEAR_UPS_AT_ONCE = 2
    url = f"unix://stand-in-{uuid.uuid4()}"
    held, release = tracker(), threading.Event()
    slow = [StandInContainer(url, held, hold=release) for _ in range(2)]
    threads = [threading.Thread(target=engine.clear_away, args=(c,)) for c in slow]
    for thread in threads:
        thread.start()
    try:
        deadline = time.monotonic() + 5
        while held["now"] < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert held["now"] == 2
        waiting = tracker()
        queued = threading.Thread(target=engine.clear_away, args=(StandInContainer(url, waiting),))
        queued.start()
        plain = tracker()
        engine.remove_container(StandInContainer(url, plain, seconds=0))
        assert plain["done"] == 1  # not behind the held slots
        queued.join(0.3)
        assert waiting["done"] == 0  # a third clear-up waits for a slot
    finally:
        release.set()
        for thread in threads:
            thread.join(10)
    queued.join(10)
    assert waiting["done"] == 1
