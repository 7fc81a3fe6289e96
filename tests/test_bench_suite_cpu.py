"""bench/suite_cpu.py's charging, pure: CPU samples to the test each session ran when they were taken."""

from __future__ import annotations

import pytest

from bench.suite_cpu import HZ, SAMPLE_S, charge, spans_of

# Session 100 runs a::one from t=10 to 12, then a::two from 13 to 20; session 200 runs b::three.
TIMELINE = "\n".join(
    [
        "10.0\t100\tstart\ttests/test_a.py::one",
        "12.0\t100\tend\ttests/test_a.py::one",
        "13.0\t100\tstart\ttests/test_a.py::two",
        "5.0\t200\tstart\ttests/test_b.py::three",
        "20.0\t100\tend\ttests/test_a.py::two",
        "30.0\t200\tend\ttests/test_b.py::three",
        "31.0\t200\tstart\ttests/test_b.py::never-ended",  # the session was killed
    ]
)


def test_spans_pair_each_sessions_starts_and_ends():
    spans = spans_of(TIMELINE)
    assert spans[100] == [(10.0, 12.0, "tests/test_a.py::one"), (13.0, 20.0, "tests/test_a.py::two")]
    assert spans[200] == [(5.0, 30.0, "tests/test_b.py::three")]


def test_samples_are_charged_to_the_test_running_then_or_shared():
    samples = [
        (11.0, 100, "chromium", 2 * HZ),
        (12.0 + SAMPLE_S / 2, 100, "daphne", HZ),  # just after a::one ended: its last half-second
        (12.9, 100, "pytest session", HZ),  # between the two tests
        (15.0, 100, "celery worker", 3 * HZ),
        (6.0, 200, "celery worker", HZ),
        (7.0, 0, "dockerd", 4 * HZ),  # no session's process
        (8.0, 999, "container", HZ),  # a session that ran no test
    ]
    charged = charge(samples, spans_of(TIMELINE))
    assert charged.by_test["tests/test_a.py::one"] == {"chromium": 2, "daphne": 1}
    assert charged.by_test["tests/test_a.py::two"] == {"celery worker": 3}
    assert charged.by_test["(between tests)"] == {"pytest session": 1}
    assert charged.by_file["tests/test_a.py"] == {"chromium": 2, "daphne": 1, "celery worker": 3}
    assert charged.by_file["tests/test_b.py"] == {"celery worker": 1}
    assert charged.by_kind == {"chromium": 2, "daphne": 1, "pytest session": 1, "celery worker": 4}
    assert charged.shared == {"dockerd": 4, "container": 1}
    assert sum(charged.by_kind.values()) + sum(charged.shared.values()) == pytest.approx(
        13
    )  # nothing lost, nothing twice
