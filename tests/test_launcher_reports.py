"""The launcher's report formats (faulttolerance/launcher.py): anything but exactly what the
launcher writes is no report at all. No Docker, no database."""

import pytest

from faulttolerance.launcher import (
    EnvCheckReport,
    ExitReport,
    parse_env_check_report,
    parse_exit_report,
    restart_decision,
)


@pytest.mark.parametrize(
    "text, report",
    [
        ("0 0\n", ExitReport(0, False)),
        ("137 1\n", ExitReport(137, True)),
        ("1 0", ExitReport(1, False)),
        ("", None),
        (None, None),
        ("-1 0", None),
        ("1 2", None),
        ("1", None),
        ("1 0 extra", None),
        ("\x00\xff", None),
    ],
)
def test_exit_reports(text, report):
    assert parse_exit_report(text) == report


@pytest.mark.parametrize(
    "text, report",
    [
        ("pass\n", EnvCheckReport(True, "")),
        ("fail dns: host name x does not resolve\n", EnvCheckReport(False, "dns: host name x does not resolve")),
        ("failed", None),
        ("", None),
        ("PASS", None),
    ],
)
def test_env_check_reports(text, report):
    assert parse_env_check_report(text) == report


def test_a_long_failure_detail_is_cut():
    assert len(parse_env_check_report("fail " + "x" * 10_000).detail) == 500


def test_the_decision_names_the_attempt():
    assert restart_decision(7) == "restart 7\n"
