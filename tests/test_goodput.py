"""Goodput (faulttolerance/goodput.py), a pure computation tested by table: what each recovery
cost (downtime + work lost since the last checkpoint) and the effective training time ratio."""

from datetime import UTC, datetime, timedelta

import pytest

from faulttolerance.goodput import Recovery, goodput

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@pytest.mark.parametrize(
    "end, recoveries, lost, ratio",
    [
        pytest.param(1000, [], 0, 1.0, id="no-failure"),
        pytest.param(1000, [Recovery(at(400), at(410), 40)], 50, 0.95, id="downtime-and-work-lost"),
        pytest.param(1000, [Recovery(at(400), at(410), None)], 10, 0.99, id="no-checkpoints-reported"),
        pytest.param(
            1000, [Recovery(at(100), at(105), 20), Recovery(at(500), at(530), 0)], 55, 0.945, id="two-recoveries"
        ),
        pytest.param(1000, [Recovery(at(900), None, 10)], 110, 0.89, id="still-restarting-at-the-end"),
        pytest.param(100, [Recovery(at(10), at(95), 500)], 100, 0.0, id="cost-capped-by-the-time"),
        pytest.param(1000, [Recovery(at(400), at(1200), 0)], 600, 0.4, id="running-again-after-the-end"),
    ],
)
def test_goodput_table(end, recoveries, lost, ratio):
    result = goodput(T0, at(end), recoveries)
    assert result.elapsed_s == end
    assert result.lost_s == pytest.approx(lost)
    assert result.ratio == pytest.approx(ratio)
    assert result.effective_s == pytest.approx(end - lost)


def test_each_recovery_cost_is_its_downtime_plus_the_work_lost():
    result = goodput(T0, at(1000), [Recovery(at(100), at(112.5), 30.25), Recovery(at(200), at(201), None)])
    assert [(c.downtime_s, c.work_lost_s, c.lost_s) for c in result.costs] == [(12.5, 30.25, 42.75), (1.0, None, 1.0)]


def test_a_job_that_never_started_has_no_goodput():
    assert goodput(None, at(10), []) is None
    assert goodput(T0, T0, []).ratio is None
