"""Log failure analysis: how an attempt's end is classified (SPEC §4).

The rules are a table, read top to bottom; the first rule that matches wins.
Each rule names its class and the explanation the user sees on the recovery
record, together with the log lines that matched.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

USER_ERROR = "user_error"
RESOURCE_ERROR = "resource_error"
ENV_CHECK_FAILED = "env_check_failed"
NODE_FAILURE = "node_failure"
TRANSIENT = "transient"
HANG = "hang"
PREEMPTED = "preempted"
TERMINATED = "terminated"

# Classes restarted without unconditional restart (SPEC §4 table).
RETRYABLE = {ENV_CHECK_FAILED, NODE_FAILURE, TRANSIENT}


@dataclass(frozen=True)
class EndFacts:
    """What is known about how one instance ended."""

    exit_code: int | None = None
    oom_killed: bool = False
    lost: bool = False  # host unreachable or container vanished
    hung: bool = False  # ended by hang detection
    start_error: str = ""  # the container could not be created or started
    # The launcher's own report (the control dir, never the log): the checks failed, and why.
    env_check_failed: bool = False
    env_check_detail: str = ""
    log_tail: tuple[str, ...] = ()  # the job's output: chooses among classes, never decides a fact


@dataclass(frozen=True)
class Rule:
    name: str
    failure_class: str
    explanation: str
    log_pattern: re.Pattern | None = None
    exit_codes: frozenset[int] = frozenset()
    state: str = ""  # "lost", "oom", "start_failed", "nonzero"

    def matches(self, facts: EndFacts) -> tuple[bool, list[str]]:
        if self.state == "lost":
            return facts.lost, []
        if self.state == "hung":
            return facts.hung, []
        if self.state == "start_failed":
            return bool(facts.start_error), [facts.start_error] if facts.start_error else []
        if self.state == "oom":
            return facts.oom_killed, []
        if self.state == "env_check":
            return facts.env_check_failed, [facts.env_check_detail] if facts.env_check_detail else []
        if self.log_pattern is not None:
            lines = [line for line in facts.log_tail if self.log_pattern.search(line)]
            return bool(lines), lines[-5:]
        if self.exit_codes:
            return facts.exit_code in self.exit_codes, []
        if self.state == "nonzero":
            return facts.exit_code not in (None, 0), []
        return False, []


RULES: tuple[Rule, ...] = (
    Rule(
        "hang-detected",
        HANG,
        "No CPU use, no log output (and no GPU use, where there are GPUs) for the whole hang window.",
        state="hung",
    ),
    Rule("host-lost", NODE_FAILURE, "The Docker host became unreachable or the container vanished.", state="lost"),
    Rule("start-failed", USER_ERROR, "The container could not be started.", state="start_failed"),
    Rule("oom", RESOURCE_ERROR, "The container was killed for using more memory than its limit (OOM).", state="oom"),
    # Only the launcher's report (it runs the checks as root with the console's own tools and
    # writes where the job cannot): a job that prints "error,exiting" isolates nothing.
    Rule("env-check", ENV_CHECK_FAILED, "A pre-flight environment check failed on this host.", state="env_check"),
    Rule(
        "collective-timeout",
        TRANSIENT,
        "A collective communication timed out or hit a system error (NCCL/HCCL); usually transient.",
        # From the first NCCL/HCCL only (a later one finds no more words after it): `(NCCL|HCCL).*`
        # alone was tried at every one of them, 0.1-0.2 s a line of "NCCL" x 1024, with 50 such
        # lines a decision spent seconds holding the worker's GIL.
        log_pattern=re.compile(
            r"^(?:(?!NCCL|HCCL).)*+(?:NCCL|HCCL).*(?:timeout|timed out|unhandled system error)", re.IGNORECASE
        ),
    ),
    Rule(
        "gpu-hardware",
        TRANSIENT,
        "The GPU reported an ECC error or an Xid event; a hardware fault outside the job.",
        log_pattern=re.compile(r"(uncorrectable ECC error|ECC error|\bXid\b)", re.IGNORECASE),
    ),
    Rule(
        "collective-connection-reset",
        TRANSIENT,
        "A connection between instances was reset during a collective.",
        log_pattern=re.compile(r"(Connection reset by peer|ECONNRESET).*", re.IGNORECASE),
    ),
    Rule(
        "image-refused",
        USER_ERROR,
        "The image has a link where the console mounts its tools, its control dir, /cache or /etc/volcano: "
        "the launcher refuses to run in it (rebuild the image without those links).",
        log_pattern=re.compile(r"^\[console\] refused: "),
    ),
    Rule(
        "python-traceback",
        USER_ERROR,
        "The training script raised an exception (Python traceback).",
        log_pattern=re.compile(r"^Traceback \(most recent call last\)|^\w+(Error|Exception): "),
    ),
    Rule(
        "killed-by-signal",
        TRANSIENT,
        "The process was killed by a signal (SIGKILL/SIGTERM/SIGHUP) it did not send itself.",
        exit_codes=frozenset({137, 143, 129}),
    ),
    Rule(
        "nonzero-exit", USER_ERROR, "The process exited with a non-zero status and no known signature.", state="nonzero"
    ),
)


@dataclass(frozen=True)
class Classification:
    failure_class: str
    rule: str
    explanation: str
    matched_lines: list[str] = field(default_factory=list)

    @property
    def retryable(self) -> bool:
        return self.failure_class in RETRYABLE


def classify(facts: EndFacts) -> Classification | None:
    """Return the class of a failed end, or None when the instance succeeded.

    The log rules come after every rule on a trusted fact, and name only classes a job may
    claim for its own failure (transient, user_error): a log line never makes a host faulty.
    """
    if facts.exit_code == 0 and not (facts.lost or facts.start_error or facts.hung):
        return None  # logged errors the job survived are not a failure
    for rule in RULES:
        matched, lines = rule.matches(facts)
        if matched:
            return Classification(rule.failure_class, rule.name, rule.explanation, lines)
    return None
