"""HangWatch's judgement with fake samples: no Docker, no GPU.

The GPU cases use a mock GPU sampler, because no GPU exists on this machine;
the CPU and log cases are also proven against real containers in
test_fault_tolerance.py.
"""

import pytest

from jobs.runtime import hang
from jobs.runtime.engine_exec import ExecResult


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def watch(monkeypatch, cpu_ns: list[int], gpu=hang.no_gpu, window=10.0):
    samples = iter(cpu_ns)
    monkeypatch.setattr(hang, "container_usage", lambda container: hang.Usage(next(samples), None))
    clock = Clock()
    return hang.HangWatch(window_s=window, gpu_sampler=gpu, clock=clock), clock


def run(w, clock, seconds: float, lines: bool = False) -> bool:
    suspected = False
    for _ in range(int(seconds / 2)):
        clock.now += 2
        suspected |= w.tick(object(), lines)
    return suspected


def test_idle_cpu_and_no_logs_for_the_window_is_a_suspected_hang(monkeypatch):
    w, clock = watch(monkeypatch, [0] * 20)
    assert not run(w, clock, 8)
    assert run(w, clock, 4)
    assert w.metrics()["idle_for_s"] >= 10


def test_log_output_keeps_a_job_alive(monkeypatch):
    w, clock = watch(monkeypatch, [0] * 40)
    assert not run(w, clock, 30, lines=True)


def test_cpu_use_keeps_a_silent_job_alive(monkeypatch):
    busy = [i * 2_000_000_000 for i in range(40)]  # one core busy
    w, clock = watch(monkeypatch, busy)
    assert not run(w, clock, 30)


def test_busy_gpu_keeps_an_idle_cpu_job_alive_with_mock_gpu(monkeypatch):
    w, clock = watch(monkeypatch, [0] * 40, gpu=lambda container: 87.0)
    assert not run(w, clock, 30)


def test_idle_gpu_and_idle_cpu_is_a_hang_with_mock_gpu(monkeypatch):
    w, clock = watch(monkeypatch, [0] * 40, gpu=lambda container: 0.0)
    assert run(w, clock, 12)
    assert w.metrics()["gpu_util_percent"] == 0.0


def test_a_hang_is_reported_once_until_activity_resumes(monkeypatch):
    w, clock = watch(monkeypatch, [0] * 60)
    assert run(w, clock, 12)
    assert not run(w, clock, 20)
    run(w, clock, 2, lines=True)
    assert run(w, clock, 12)


def readings(monkeypatch, values: list[int | None]):
    """The engine's CPU counter as read turn by turn; None: that reading failed (as a timed-out
    or refused `stats` call fails in HangWatch.sample)."""
    values = iter(values)

    def usage(container):
        value = next(values)
        if value is None:
            raise TimeoutError("stats did not answer (injected)")
        return hang.Usage(value, None)

    monkeypatch.setattr(hang, "container_usage", usage)


def test_a_window_whose_cpu_could_not_be_read_is_no_hang(monkeypatch):
    """Silence is not idleness: an engine that cannot say how much CPU the job used (slowed down
    by another team's job, say) does not get a healthy, quiet job restarted."""
    w, clock = watch(monkeypatch, [])
    readings(monkeypatch, [0] + [None] * 30)
    assert not run(w, clock, 60)
    assert w.metrics()["cpu_measured_idle_s"] == 0


def test_cpu_read_again_after_failed_readings_measures_the_whole_gap(monkeypatch):
    # Busy through the gap: the first reading that works shows it (the counter is cumulative).
    w, clock = watch(monkeypatch, [])
    readings(monkeypatch, [0] + [None] * 10 + [20 * 2_000_000_000] + [20 * 2_000_000_000] * 3)
    assert not run(w, clock, 28)
    # Idle through the gap: measured idle from the last reading that worked, so a hang.
    w, clock = watch(monkeypatch, [])
    readings(monkeypatch, [0] + [None] * 10 + [0])
    assert not run(w, clock, 22)
    assert run(w, clock, 2)
    assert w.metrics()["cpu_measured_idle_s"] >= 10


def test_a_counter_that_went_down_measures_nothing(monkeypatch):
    """The engine started the container again (its CPU counter starts from zero): the interval
    across it is not idleness, however long the engine was away."""
    w, clock = watch(monkeypatch, [])
    busy = 50 * 2_000_000_000
    readings(monkeypatch, [busy] + [None] * 10 + [1_000] + [1_000 + i * 2_000_000_000 for i in range(1, 10)])
    assert not run(w, clock, 40)


def test_a_short_window_needs_one_idle_interval_measured(monkeypatch):
    w, clock = watch(monkeypatch, [0] * 10, window=2.0)
    assert not run(w, clock, 2)  # past the window, but only one reading: nothing measured yet
    assert run(w, clock, 2)


def test_nvidia_smi_sampler_parses_the_busiest_gpu_with_mock_gpu(monkeypatch):
    """No GPU here: nvidia-smi's answer is mocked (the exec around it is tested for real in
    tests/test_trusted_control.py and by the hang tests that run)."""
    calls = []

    def fake_exec(container, cmd, **kwargs):
        calls.append((cmd, kwargs))
        return ExecResult(0, b"3\n91\n0\n", b"")

    monkeypatch.setattr(hang, "exec_bounded", fake_exec)
    assert hang.nvidia_smi_gpu(object()) == 91.0
    ((cmd, kwargs),) = calls
    assert cmd[0] == "nvidia-smi" and kwargs["user"] == "1000:1000" and kwargs["timeout_s"] <= 10
    monkeypatch.setattr(hang, "exec_bounded", lambda *a, **k: ExecResult(0, b"N/A\n\xff garbage", b""))
    assert hang.nvidia_smi_gpu(object()) is None


# nvidia-smi's answers to the sampler's question, recorded on an NVIDIA H200 (driver 580.159.04)
# lent to this project on 2026-12-04: a bf16 matmul loop running, idle, and a GPU index that is
# not there (exit 6). The launcher's gpu-check passed there ("1 GPU device(s) visible": nvidia0
# beside nvidiactl, nvidia-uvm, nvidia-caps), run by the console's busybox.
H200_ANSWERS = [
    (ExecResult(0, b"99\n", b""), 99.0),
    (ExecResult(0, b"0\n", b""), 0.0),
    (ExecResult(6, b"No devices were found\n", b""), None),
]


@pytest.mark.parametrize(("answer", "busiest"), H200_ANSWERS)
def test_nvidia_smi_answers_recorded_on_an_h200_with_mock_gpu(monkeypatch, answer, busiest):
    monkeypatch.setattr(hang, "exec_bounded", lambda *a, **k: answer)
    assert hang.nvidia_smi_gpu(object()) == busiest
