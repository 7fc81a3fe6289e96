"""The container launcher (launcher.sh beside this file): what it is given and what it
reports. Pure: jobs/runtime/ starts containers with it and reads its reports from the
control dir (jobs/runtime/engine.py, reports.py); this module only knows the formats.

The launcher runs the environment checks of SPEC §5 and the user's command; its reports
are the only facts the console takes from inside a container (docs/decisions.md,
"A trusted control channel").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

# The script without its comment lines: it travels in the container's command.
LAUNCHER = "\n".join(
    line for line in Path(__file__).with_name("launcher.sh").read_text().splitlines() if not line.startswith("#")
)


DECISION_TIMEOUT_S = 30  # how long a launcher waits for a decision
DECISION_POLL_S = 0.05  # how often it looks for one when no wake comes (the wake ends a look at once)
DNS_WAIT_S = 30  # how long the dns check waits for the other instances' names
REFUSED_EXIT_CODE = 87  # the image shadows the console's mounts with links


def check_environment(*, fault_tolerant: bool, pool, flavor) -> dict[str, str]:
    """The launcher's settings for the SPEC §5 checks: thresholds from the pool (so small test
    hosts can pass), the ulimit check for IB flavors, gpu-check for GPU flavors. With R = 0
    nothing runs: no check and no process-level restart (seed 000, table 2)."""
    return {
        # Set here, so that an image's ENV cannot (the job's env vars may not name MA_*).
        "MA_DECISION_TIMEOUT_S": str(DECISION_TIMEOUT_S),
        "MA_DECISION_POLL_S": str(DECISION_POLL_S),
        "MA_CHECK_DNS_WAIT_S": str(DNS_WAIT_S),
        "MA_PROCESS_RESTART": "1" if fault_tolerant else "0",
        "MA_ENV_CHECKS": "1" if fault_tolerant else "0",
        "MA_CHECK_ROOT_GB": str(pool.check_root_gb),
        "MA_CHECK_SHM_GB": str(pool.check_shm_gb),
        "MA_CHECK_CACHE_GB": str(pool.check_cache_gb),
        "MA_CHECK_ULIMIT": "1" if flavor and flavor.uses_ib else "0",
        "MA_CHECK_GPU": "1" if flavor and flavor.gpus else "0",
        "MA_CHECK_ULIMIT_MEMLOCK": str(pool.check_ulimit_memlock),
        "MA_CHECK_ULIMIT_NOFILE": str(pool.check_ulimit_nofile),
        "MA_CHECK_ULIMIT_STACK": str(pool.check_ulimit_stack),
        "MA_CHECK_ULIMIT_NPROC": str(pool.check_ulimit_nproc),
    }


@dataclass(frozen=True)
class ExitReport:
    code: int
    oom_killed: bool


@dataclass(frozen=True)
class EnvCheckReport:
    passed: bool
    detail: str  # "<item>: <why>" for a failure


def exit_report_name(attempt_number: int) -> str:
    return f"exit-{attempt_number}"


ENV_CHECK_REPORT = "env-check"
DECISION = "decision"
GO = "go"  # a standby's launcher runs the checks and the job only once this is in its control dir
STANDBY_MARK = "standby"  # written beside a standby's launcher: it waits for its go
BIND_TARGETS = "bind-targets"  # a standby's bind mount targets, one a line, for its launcher to report on
MOUNTS_CHECK = "check"  # the console asks (a nonce) ...
MOUNTS_REPORT = "mounts"  # ... the launcher answers: the nonce, then "<device> <inode>" of each target
STANDBY_FILES = (STANDBY_MARK, BIND_TARGETS, MOUNTS_CHECK, MOUNTS_REPORT)


def parse_exit_report(text: str | None) -> ExitReport | None:
    """`<exit code> <0|1>` as the launcher writes it; None for anything else."""
    parts = (text or "").split()
    if len(parts) != 2 or not parts[0].isdigit() or parts[1] not in ("0", "1"):
        return None
    return ExitReport(int(parts[0]), parts[1] == "1")


def parse_env_check_report(text: str | None) -> EnvCheckReport | None:
    """`pass` or `fail <item>: <detail>`; None when the checks did not finish (or did not run)."""
    text = (text or "").strip()
    if text == "pass":
        return EnvCheckReport(True, "")
    if text.startswith("fail "):
        return EnvCheckReport(False, text.removeprefix("fail ")[:500])
    return None


def restart_decision(attempt_number: int) -> str:
    """What the console writes for a process-level restart as attempt N."""
    return f"restart {attempt_number}\n"


def go_text(attempt_number: int) -> str:
    """What the console writes as a standby's go (the launcher only asks that it is there)."""
    return f"go {attempt_number}\n"


DEVICE_INODE = re.compile(r"(\d{1,20}) (\d{1,20})", re.ASCII)


def parse_mounts_report(text: str | None, nonce: str) -> list[tuple[int, int]] | None:
    """The launcher's answer to the check with this nonce: `<device> <inode>` a line after the
    nonce; None when there is none yet (or one to an earlier check) or a line is anything else."""
    lines = (text or "").splitlines()
    if not lines or lines[0] != nonce:
        return None
    found: list[tuple[int, int]] = []
    for line in lines[1:]:
        if not (match := DEVICE_INODE.fullmatch(line)):
            return None
        found.append((int(match[1]), int(match[2])))
    return found
