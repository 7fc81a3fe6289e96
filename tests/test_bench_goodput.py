"""bench/goodput.py's measure, pure: the time spent on the steps the model keeps, from the training
process's log lines (the same rule for the console's job and Docker's)."""

from __future__ import annotations

import pytest

from bench.goodput import runs_of, useful

S = 1_000_000_000  # ns


def log(run_start: float, resume: int, steps: range, every: int = 20, step_s: float = 0.1) -> list[tuple[int, str]]:
    """One run of the demo: its checkpoint line, a progress line per step, a save every `every`."""
    start = "no checkpoint, starting from step 0" if resume == 0 else f"resumed from step={resume}"
    lines = [(int(run_start * S), f"[checkpoint] {start}")]
    for n, step in enumerate(steps, 1):
        at = int((run_start + n * step_s) * S)
        lines.append((at, f"[progress] step={step} loss=0.5"))
        if step % every == 0:
            lines.append((at + 1000, f"[checkpoint] saved step={step}"))
    return lines


# Run 1 trains steps 1-30 (checkpoint at 20) and dies; run 2 resumes from 20 at t = 4 s.
KILLED = log(0, 0, range(1, 31)) + log(4, 20, range(21, 51))


def test_a_run_still_training_at_the_end_keeps_every_step_since_its_checkpoint():
    result = useful(runs_of(KILLED), end_ns=7 * S)
    assert (result.final_step, result.computed) == (50, 60)
    # Steps 1-20 of run 1 (2 s) and 21-50 of run 2 (3 s): steps 21-30 of run 1 were done again.
    assert result.ratio == pytest.approx(5 / 7)
    assert result.lost_s(0, 4 * S) == pytest.approx(2.0)  # run 1's lost steps and the downtime


def test_a_run_that_stopped_logging_keeps_only_its_last_checkpoint():
    result = useful(runs_of(KILLED), end_ns=10 * S)  # run 2's last line at 7 s: dead or hung since
    assert result.final_step == 40
    assert result.ratio == pytest.approx(4 / 10)


def test_a_run_that_saved_nothing_hands_on_the_checkpoint_it_resumed_from():
    lines = KILLED + log(8, 40, range(41, 41))  # resumed from 40 and died before its first step
    result = useful(runs_of(lines), end_ns=10 * S)
    assert result.final_step == 40 and result.ratio == pytest.approx(4 / 10)


def test_lines_after_the_end_do_not_count():
    result = useful(runs_of(KILLED), end_ns=int(5.5 * S))
    assert result.final_step == 35 and result.ratio == pytest.approx(3.5 / 5.5)
