"""The SamplingPool that turns every followed container's Sampler on a few threads (hang.py):
no Docker, no worker. Turns are counted, never timed: each wait below is for something to
happen at all, with a deadline far above what it needs."""

import threading
import time

import pytest

from jobs.runtime import hang

DEADLINE_S = 30


class CountingSampler(hang.Sampler):
    """A Sampler whose turn counts itself (and may wait, or raise) instead of asking an engine."""

    def __init__(self, pool, engine_answers: threading.Event | None = None, fail: bool = False, engine: str = ""):
        super().__init__(watch=None, container=None, pool=pool, engine=engine)
        self.turns = 0
        self.engine_answers, self.fail = engine_answers, fail
        self.turned = threading.Event()
        self.inside = 0
        self.overlapped = False  # two turns of one watch at once: what the pool must never do

    def turn(self) -> None:
        self.inside += 1
        self.overlapped |= self.inside > 1
        self.turns += 1
        self.turned.set()
        try:
            if self.engine_answers is not None:
                self.engine_answers.wait()
            time.sleep(0.001)  # a turn takes a while: room for a second one of the same sampler
            if self.fail:
                raise RuntimeError("the engine said no")
        finally:
            self.inside -= 1


@pytest.fixture
def samplers():
    """Makes CountingSamplers on a pool of its own and stops them all at the end, passed or not
    (one left turning every 10 ms would load the rest of the session)."""
    made: list[CountingSampler] = []
    released: list[threading.Event] = []

    def make(pool, **kwargs) -> CountingSampler:
        sampler = CountingSampler(pool, **kwargs)
        made.append(sampler)
        if sampler.engine_answers is not None:
            released.append(sampler.engine_answers)
        return sampler

    yield make
    for sampler in made:
        sampler.stop()
    for event in released:
        event.set()


def wait_for(condition) -> bool:
    until = time.monotonic() + DEADLINE_S
    while time.monotonic() < until:
        if condition():
            return True
        time.sleep(0.01)
    return False


def test_every_sampler_is_turned_again_and_again_on_a_few_threads(samplers):
    pool = hang.SamplingPool(threads=2, every_s=0.01)
    many = [samplers(pool) for _ in range(50)]
    before = set(threading.enumerate())
    for sampler in many:
        sampler.start()
    assert wait_for(lambda: all(s.turns >= 3 for s in many))
    started = set(threading.enumerate()) - before
    assert len(started) == 3  # the clock and two turning threads, not one per sampler
    assert not any(s.overlapped for s in many)


def test_a_sampler_is_started_once(samplers):
    sampler = samplers(hang.SamplingPool(threads=1, every_s=0.01))
    sampler.start()
    with pytest.raises(RuntimeError):
        sampler.start()


def test_a_stopped_sampler_is_turned_no_more_and_leaves_the_pool(samplers):
    pool = hang.SamplingPool(threads=2, every_s=0.01)
    stopped, running = samplers(pool), samplers(pool)
    stopped.start()
    running.start()
    assert wait_for(lambda: stopped.turns >= 1)
    stopped.stop()
    turns_when_stopped = stopped.turns
    seen = running.turns
    assert wait_for(lambda: running.turns >= seen + 5)  # turns went on meanwhile
    assert stopped.turns <= turns_when_stopped + 1  # at most the one under way when it stopped
    running.stop()
    assert wait_for(lambda: pool.waiting() == 0)


def test_a_turn_that_waits_on_a_silent_engine_does_not_hold_the_others(samplers):
    pool = hang.SamplingPool(threads=2, every_s=0.01)
    engine_answers = threading.Event()
    stuck = samplers(pool, engine_answers=engine_answers)
    others = [samplers(pool) for _ in range(5)]
    stuck.start()
    assert stuck.turned.wait(DEADLINE_S)  # one turning thread is now held by it
    for sampler in others:
        sampler.start()
    assert wait_for(lambda: all(s.turns >= 3 for s in others))
    assert stuck.turns == 1
    engine_answers.set()
    assert wait_for(lambda: stuck.turns >= 2)  # and it is turned again once its call returned


def test_an_engine_that_does_not_answer_holds_threads_of_its_own_never_the_others_turns(samplers):
    # Stands in for a host whose engine went silent (its calls wait until it answers): the pool's
    # scheduling is what is tested here; the engine's own silence is test_hosts' and liveness's.
    pool = hang.SamplingPool(threads=2, every_s=0.01)
    engine_answers = threading.Event()
    silent = [samplers(pool, engine_answers=engine_answers, engine="tcp://silent:2376") for _ in range(6)]
    for sampler in silent:
        sampler.start()
    assert wait_for(lambda: sum(s.turns for s in silent) == 2)  # its two turns under way...
    others = [samplers(pool, engine="unix:///var/run/docker.sock") for _ in range(5)]
    for sampler in others:
        sampler.start()
    assert wait_for(lambda: all(s.turns >= 3 for s in others))  # ...never the others'
    assert sum(s.turns for s in silent) == 2  # the rest of its samplers wait behind those two
    assert pool.turning_threads() <= 4  # two held by the silent engine, two for the others
    engine_answers.set()
    assert wait_for(lambda: all(s.turns >= 2 for s in silent))  # all of its samplers turn again
    assert not any(s.overlapped for s in silent + others)


def test_the_threads_grow_no_further_than_max_threads(samplers):
    pool = hang.SamplingPool(threads=1, every_s=0.01, max_threads=2)
    engine_answers = threading.Event()
    silent = [samplers(pool, engine_answers=engine_answers, engine=f"tcp://silent-{n}:2376") for n in range(3)]
    for sampler in silent:
        sampler.start()
    assert wait_for(lambda: sum(s.turns for s in silent) == 2)  # two threads, both held
    time.sleep(0.2)
    assert pool.turning_threads() == 2
    assert sum(s.turns for s in silent) == 2  # the third engine's turn waits for a thread
    engine_answers.set()
    assert wait_for(lambda: all(s.turns >= 2 for s in silent))


def test_one_engine_has_as_many_turns_under_way_as_the_pool_has_threads(samplers):
    pool = hang.SamplingPool(threads=3, every_s=0.01)
    engine_answers = threading.Event()
    waiting = [samplers(pool, engine_answers=engine_answers) for _ in range(10)]
    for sampler in waiting:
        sampler.start()
    assert wait_for(lambda: sum(s.turns for s in waiting) == 3)
    time.sleep(0.2)  # twenty of its turns' periods: none more starts, no thread is added for it
    assert sum(s.turns for s in waiting) == 3
    assert pool.turning_threads() == 3
    for sampler in waiting[:5]:
        sampler.stop()  # stopped while waiting behind: they leave when a turn ends
    engine_answers.set()
    assert wait_for(lambda: all(s.turns >= 3 for s in waiting[5:]))
    assert [s.turns for s in waiting[:5]] == [1, 1, 1, 0, 0]  # the first three were under way


def test_a_turn_that_raises_is_logged_and_the_sampler_turns_on(samplers, caplog):
    pool = hang.SamplingPool(threads=1, every_s=0.01)
    failing = samplers(pool, fail=True)
    failing.start()
    assert wait_for(lambda: failing.turns >= 3)
    assert "sampling a container failed" in caplog.text


def test_threads_grown_for_silent_engines_leave_once_idle_and_grow_again(samplers):
    """Past its `threads`, a thread without a turn for `idle_s` leaves (and with it its engine
    clients); the pool grows again for the next silent engines."""
    pool = hang.SamplingPool(threads=1, every_s=0.01, max_threads=4, idle_s=0.1)

    def hold_three() -> tuple[threading.Event, list[CountingSampler]]:
        engine_answers = threading.Event()
        silent = [samplers(pool, engine_answers=engine_answers, engine=f"tcp://silent-{n}:2376") for n in range(3)]
        for sampler in silent:
            sampler.start()
        assert wait_for(lambda: sum(s.turns for s in silent) == 3)  # each engine holds a thread
        return engine_answers, silent

    engine_answers, silent = hold_three()
    assert pool.turning_threads() == 3
    time.sleep(0.3)  # idle past idle_s, but every thread is held by a turn: none leaves
    assert pool.turning_threads() == 3
    for sampler in silent:
        sampler.stop()
    engine_answers.set()
    assert wait_for(lambda: pool.turning_threads() == 1)  # back to the pool's own
    engine_answers, again = hold_three()
    assert pool.turning_threads() == 3
    engine_answers.set()
    assert wait_for(lambda: all(s.turns >= 2 for s in again))
