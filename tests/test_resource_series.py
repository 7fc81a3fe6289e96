"""Resource charts' storage, without Docker: the bounded series (jobs/models/resources.py), the
engine's stats answer read (jobs/runtime/engine_stats.py), a recorder's arithmetic and the
batch writer (jobs/runtime/resources.py). The real samples of real containers are in
tests/test_resources.py and tests/test_browser_resources.py."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from jobs.models import Attempt, ResourceSeries, TaskRun, TrainingJob
from jobs.models.resources import MAX_POINTS, POINT, Point, Series
from jobs.runtime import resources
from jobs.runtime.engine_stats import NO_USAGE, Usage, parse_stats
from jobs.runtime.hang import Sample
from tests.helpers import BUSYBOX

WEEK_S = 7 * 24 * 3600


def filled(seconds: int, step: int = 10, cpu=lambda t: 1500, memory=lambda t: 200 * 1024, gpu=lambda t: None):
    series = Series(step_s=step)
    for end in range(step, seconds + 1, step):
        series.add(Point(end, step, cpu(end), memory(end), gpu(end)))
    return series


def test_a_week_long_series_stays_bounded_and_keeps_its_whole_span():
    series = filled(WEEK_S)
    assert len(series.points) <= MAX_POINTS
    assert len(series.pack()) <= MAX_POINTS * POINT.size  # ~13 KB at most, whatever the length
    assert series.step_s >= WEEK_S // MAX_POINTS  # the resolution halved as often as needed
    assert series.points[0].start == 0 and series.points[-1].end == WEEK_S
    # Neighbours are contiguous: nothing of the week fell out between two points.
    assert all(b.start == a.end for a, b in zip(series.points, series.points[1:], strict=False))
    assert {p.cpu_milli for p in series.points} == {1500}


def test_merging_keeps_cpu_time_and_the_memory_peak():
    spike_at = 3 * 24 * 3600 + 120

    def cpu(t):
        return 2000 if (t // 3600) % 2 else 0  # busy every other hour

    series = filled(WEEK_S, cpu=cpu, memory=lambda t: (4 << 20) if t == spike_at else 100 * 1024)
    stored = sum(p.cpu_milli * p.span for p in series.points)
    assert stored == pytest.approx(sum(cpu(t) * 10 for t in range(10, WEEK_S + 1, 10)), rel=0.001)
    assert max(p.memory_kib for p in series.points) == 4 << 20  # an OOM's cause is not averaged away


def test_samples_faster_than_the_resolution_fill_the_last_point():
    series = Series(step_s=40)
    for end in range(10, 101, 10):
        series.add(Point(end, 10, 1000, 1, None))
    assert [(p.start, p.end) for p in series.points] == [(0, 40), (40, 80), (80, 100)]


def test_a_gap_is_kept_and_packing_round_trips_missing_values():
    series = Series(step_s=10)
    series.add(Point(10, 10, 250, 2048, None))
    series.add(Point(60, 10, None, 4096, 875))  # 40 s unmeasured before it
    again = Series.unpack(series.pack(), series.step_s)
    assert again == series
    assert again.points[1].start > again.points[0].end


def test_gpu_values_average_with_fake_gpu_samples():
    """No GPU on this machine: the GPU numbers here are made up, as a GpuSampler would give them."""
    series = filled(MAX_POINTS * 10 + 10, gpu=lambda t: 900 if (t // 10) % 2 else 100)
    assert series.step_s == 20
    assert {p.gpu_permille for p in series.points[:-1]} == {500}


STATS_V1 = {
    "read": "2026-01-01T00:00:00.1Z",
    "cpu_stats": {"cpu_usage": {"total_usage": 1451587477}},
    "memory_stats": {"usage": 110_000_000, "limit": 268435456, "stats": {"total_inactive_file": 10_000_000}},
}
STATS_V2 = {
    "read": "2026-01-01T00:00:00.1Z",
    "cpu_stats": {"cpu_usage": {"total_usage": 42}},
    "memory_stats": {"usage": 5000, "stats": {"inactive_file": 1000}},
}
STATS_ENDED = {"read": "0001-01-01T00:00:00Z", "cpu_stats": {"cpu_usage": {"total_usage": 0}}, "memory_stats": {}}


def test_the_engines_stats_answer_is_read_as_docker_stats_shows_it():
    assert parse_stats(STATS_V1) == Usage(1451587477, 100_000_000)
    assert parse_stats(STATS_V2) == Usage(42, 4000)
    assert parse_stats(STATS_ENDED) == NO_USAGE
    assert parse_stats({"read": "2026-01-01T00:00:00Z", "memory_stats": {"usage": "a lot"}}) == NO_USAGE


def run_at(origin: float, baseline) -> resources._Run:
    row = ResourceSeries(task_run_id=1, origin=datetime.fromtimestamp(origin, tz=UTC), step_s=2)
    return resources._Run(1, row, baseline)


def test_a_point_is_the_cpu_time_used_since_the_previous_one():
    run = run_at(1000.0, (0, 1000.0))  # the container started at 1000 s with 0 ns used
    run.add(Sample(1002.0, Usage(3_000_000_000, 64 << 20), None))  # 3 s of CPU in 2 s: 1.5 cores
    run.add(Sample(1004.0, Usage(3_500_000_000, 65 << 20), None))
    assert [(p.start, p.end, p.cpu_milli, p.memory_kib) for p in run.series.points] == [
        (0, 2, 1500, 64 << 10),
        (2, 4, 250, 65 << 10),
    ]
    assert run.row.cpu_ns == 3_500_000_000 and run.dirty


def test_no_reading_and_a_counter_that_went_back_make_no_point():
    run = run_at(1000.0, None)  # adopted without a row: the first reading is only a baseline
    run.add(Sample(1002.0, Usage(5_000_000_000, 1 << 20), None))
    run.add(Sample(1004.0, NO_USAGE, None))
    run.add(Sample(1006.0, Usage(1_000_000_000, 1 << 20), None))
    assert run.series.points == [] and not run.dirty
    run.add(Sample(1008.0, Usage(2_000_000_000, 1 << 20), None))
    assert [(p.start, p.end, p.cpu_milli) for p in run.series.points] == [(6, 8, 500)]


# Transactional: autocommit, as in the worker, where a deleted task run fails the statement.
@pytest.mark.django_db(transaction=True)
def test_the_writer_writes_every_changed_series_in_one_statement(demo):
    job = TrainingJob.objects.create(workspace=demo.workspace, created_by=demo.owner, name="rows", image=BUSYBOX)
    attempt = Attempt.objects.create(job=job, number=1)
    runs = TaskRun.objects.bulk_create(
        TaskRun(attempt=attempt, index=i, host=demo.host, container_name=f"c{i}") for i in range(50)
    )
    writer = resources.ResourceWriter(every_s=3600)  # flushed by hand here, never by its thread
    recorded = []
    for task_run in runs:
        row = ResourceSeries(task_run_id=task_run.id, origin=datetime.fromtimestamp(1000, tz=UTC), step_s=2)
        run = resources._Run(task_run.id, row, (0, 1000.0))
        run.add(Sample(1002.0, Usage(1_000_000_000, 10 << 20), None))
        writer._runs.append(run)
        recorded.append(run)
    with CaptureQueriesContext(connection) as queries:
        assert writer.flush() == 50
    statements = [q["sql"] for q in queries if q["sql"] not in ("BEGIN", "COMMIT")]  # bulk_create's transaction
    assert len(statements) == 1 and "ON CONFLICT" in statements[0]
    with CaptureQueriesContext(connection) as queries:
        assert writer.flush() == 0  # nothing changed: nothing written
    assert len(queries) == 0

    recorded[0].add(Sample(1004.0, Usage(3_000_000_000, 12 << 20), None))
    recorded[0].closed = True  # its follower ended: written once more, then forgotten
    TaskRun.objects.filter(id=runs[1].id).delete()  # a deleted job's run: not the others' problem
    recorded[1].add(Sample(1004.0, Usage(2_000_000_000, 12 << 20), None))
    assert writer.flush() == 2
    assert writer.pending() == 48
    stored = ResourceSeries.objects.get(task_run_id=runs[0].id).series()
    assert [(p.end, p.cpu_milli, p.memory_kib) for p in stored.points] == [(2, 500, 10 << 10), (4, 1000, 12 << 10)]
    assert ResourceSeries.objects.count() == 49
