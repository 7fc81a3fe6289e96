"""The Prometheus text format as jobs/runtime/metrics.py parses it: what a job's metrics command or
URL printed, so any bytes, up to the scrape's 2 MiB. No Docker: the scrape itself is
tests/test_metrics.py."""

from __future__ import annotations

import math

import pytest

from jobs.runtime.metrics import parse
from tests.helpers import no_longer_than

EXPOSITION = r"""# HELP loss Training loss.
# TYPE loss gauge
loss{phase="train",note="a\"b"} 0.25
step_total 12 1700000000
not a sample
inf_metric +Inf
empty{} 1
braced{text="} {",} 2
"""
LONG = 2 * 1024 * 1024  # MAX_OUTPUT_BYTES: as much as a scrape keeps


def test_the_text_format_is_parsed_and_bad_lines_are_named():
    samples, types, problems = parse(EXPOSITION)
    assert [(s.name, s.labels, s.value) for s in samples if s.name != "inf_metric"] == [
        ("loss", {"phase": "train", "note": 'a"b'}, 0.25),
        ("step_total", {}, 12.0),
        ("empty", {}, 1.0),
        ("braced", {"text": "} {"}, 2.0),
    ]
    assert math.isinf(next(s.value for s in samples if s.name == "inf_metric"))
    assert types == {"loss": "gauge"}
    assert problems == ["line 5 is not a sample: not a sample"]


@pytest.mark.parametrize(
    "line",
    [
        "m{" + "a" * LONG + "} 1",  # took hours: every start of the letters retried every length
        "m{" + "a=" * (LONG // 2) + "} 1",
        'm{a="' + "\\" * LONG + "} 1",
        "m{" + "} " * (LONG // 2) + "1",
        "a" * LONG,
        "m " + "1 " * (LONG // 2) + "x",
    ],
    ids=["letters", "names-without-values", "backslashes", "closing-braces", "one-name", "many-values"],
)
def test_a_line_the_job_crafted_is_refused_in_one_pass(line):
    """A job writes its metrics: one line as long as a scrape keeps, shaped to make a backtracking
    pattern retry (the old one spent 32 s on 40,000 letters in braces, holding every thread of the
    process that scraped). Each is a problem named by its line, found at once."""
    with no_longer_than(20):
        samples, types, problems = parse(f"ok 1\n{line}\nalso_ok 2\n")
    assert [s.name for s in samples] == ["ok", "also_ok"] and types == {}
    assert len(problems) == 1 and problems[0].startswith("line 2 is not a sample: ")
    assert len(problems[0]) < 120  # the line is quoted in part
