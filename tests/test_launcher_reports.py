"""The launcher's report formats (faulttolerance/launcher.py): anything but exactly what the
launcher writes is no report at all. No Docker, no database."""

import pytest

from faulttolerance.launcher import (
    EnvCheckReport,
    ExitReport,
    parse_env_check_report,
    parse_exit_report,
    parse_mounts_report,
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


@pytest.mark.parametrize(
    "text, found",
    [
        ("n1\n2049 131\n2049 77\n", [(2049, 131), (2049, 77)]),
        ("n1\n", []),
        ("n1", []),
        ("n0\n2049 131\n", None),  # the answer to an earlier check
        ("", None),
        (None, None),
        ("n1\n2049\n", None),
        ("n1\n- -\n", None),  # a target that was not there: no answer to compare
        ("n1\n2049 -5\n", None),
        ("n1\n\x00\xff 1\n", None),
        ("n1\n\u00b2 1\n", None),  # a digit to str.isdigit, not to int()
        ("n1\n2049  131\n", None),
    ],
)
def test_mounts_reports(text, found):
    """A standby's answer to the take-over's check (launcher.sh step 1): its nonce, then
    "<device> <inode>" a line; anything else is no answer (the take-over refuses the standby)."""
    assert parse_mounts_report(text, "n1") == found


def test_a_spec_with_an_nfs_export_is_told_apart():
    """An armed standby would hold an NFS export's folder as it was: such a job is not armed."""
    from jobs.runtime import docker_hosts, engine

    bind = engine.bind_mount("/data", "/srv/data")
    nfs = engine.volume_mount("/nfs", "console-nfs-x-1", nfs={"type": "nfs", "o": "addr=10.0.0.1", "device": ":/e"})
    cache = engine.volume_mount("/cache", "console-cache-x-0")
    assert not docker_hosts.has_network_volumes({"mounts": [bind, cache]})
    assert docker_hosts.has_network_volumes({"mounts": [bind, nfs, cache]})
    assert docker_hosts.bind_sources({"mounts": [bind, nfs, cache]}) == [("/data", "/srv/data")]
