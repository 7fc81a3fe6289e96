"""The report of bench/restart_latency.py: its table of medians against the bare start and
Docker's policy, where each restart's time goes, and the targets' verdicts (exit status 0 when
every one is met). Measuring is restart_latency.py's; this module only reads its samples."""

from __future__ import annotations

import os

from bench._trace import median, ms, trace_breakdown

RETRIES = 6  # Docker's MaximumRetryCount and the console's R in (b) and (c)
CONTAINER_TARGET_RATIO = 1.15  # the issue "One supervisor that scales"
PROCESS_TARGET_MS = 50


def row(name: str, values: list[float], bare: float, docker: float | None, target: str = "") -> None:
    m = median(values)
    vs_docker = f"{m / docker:6.2f}x" if docker else "      "
    spread = f"{min(values):7.0f}-{max(values):<7.0f}" if values else ""
    print(f"  {name:<44} {len(values):>3} {m:9.0f} {spread:>16} {m / bare:7.2f}x  {vs_docker}  {target}")


# The steps of every container-level restart before its next container is taken, started or made.
DECIDED = [
    ("die -> attempt ended (follower noticed; claimed for the decision)", "die", "attempt_ended"),
    ("attempt ended -> next attempt created (classify, decide)", "attempt_ended", "next_created"),
]


def breakdown(title: str, samples: list[dict], steps: list[tuple[str, str, str]]) -> None:
    print(f"\n{title} (median ms of each step):")
    for label, start, end in steps:
        values = [ms(s[end] - s[start]) for s in samples if s.get(start) and s.get(end)]
        print(
            f"  {label:<62} {median(values):8.1f}   (n={len(values)}, {min(values, default=0):.1f}-"
            f"{max(values, default=0):.1f})"
        )


def report(
    *,
    docker_version: str,
    bare: dict[str, list[float]],
    policy: dict,
    process: list[dict],
    container: list[dict],
    steps: dict[str, list[float]],
    trace: list,
    worker_log: str,
) -> int:
    """Print everything; 0 when every target is met, else 1."""
    # The baseline: every bare start, up front and between the console's restarts.
    bare_all = bare["api"] + bare["interleaved"]
    bare_ms = median(bare_all)
    docker_ms = {n: median(v) for n, v in policy["die_to_start"].items()}
    print(f"\nDocker {docker_version}, {os.cpu_count()} CPUs; medians in ms")
    print(f"  {'case':<44} {'n':>3} {'median':>9} {'min-max':>16} {'vs bare':>8}  {'vs pol.':>7}  target (median)")
    row("(a) bare start, API, up front", bare["api"], bare_ms, None)
    row("(a) bare start, API, between the restarts", bare["interleaved"], bare_ms, None)
    row("(a) bare start, API, all (the baseline)", bare_all, bare_ms, None)
    row("(a) bare start, `docker start` CLI", bare["cli"], bare_ms, None)
    for n in range(1, RETRIES + 1):
        row(f"(b) Docker on-failure retry {n}: die -> start", policy["die_to_start"][n], bare_ms, docker_ms[n])
    for n in range(1, RETRIES + 1):
        row(
            f"    Docker on-failure retry {n}: start -> start",
            policy["start_to_start"][n],
            bare_ms,
            median(policy["start_to_start"][n]),
        )

    verdicts: list[tuple[str, bool]] = []
    container_level = [ms(s["user"] - s["die"]) for s in container if s["level"] == "container"]
    job_level = [ms(s["user"] - s["die"]) for s in container if s["level"] == "job"]
    ok = median(container_level) <= CONTAINER_TARGET_RATIO * bare_ms
    verdicts.append((f"container level <= {CONTAINER_TARGET_RATIO}x bare start", ok))
    row(
        "(c) console container level: die -> job again",
        container_level,
        bare_ms,
        docker_ms[1],
        f"<= {CONTAINER_TARGET_RATIO * bare_ms:.0f} {'MET' if ok else 'MISSED'}",
    )
    row("(c) console job level (same host): die -> job again", job_level, bare_ms, None)
    for n in range(1, RETRIES + 1):
        values = [ms(s["user"] - s["die"]) for s in container if s["retry"] == n]
        levels = "/".join(sorted({s["level"] for s in container if s["retry"] == n}))
        ok = median(values) < docker_ms[n]
        verdicts.append((f"console retry {n} < Docker retry {n}", ok))
        row(
            f"(c) console retry {n} ({levels}): die -> job again",
            values,
            bare_ms,
            docker_ms[n],
            f"< {docker_ms[n]:.0f} {'MET' if ok else 'MISSED'}",
        )
    started = [ms(s["start"] - s["die"]) for s in container if s["start"] > s["die"]]
    if started:
        row("(c) console, restarts that started a container: die -> start", started, bare_ms, None)
    db_values = [ms(s["db_running_again"] - s["db_detected"]) for s in container]
    row("(c) console, all retries: RecoveryRecord downtime", db_values, bare_ms, None)

    standbys = sum(1 for s in container if s["standby"])
    armed = sum(1 for s in container if s["armed"])
    print(f"  ({standbys} of {len(container)} container restarts took a standby made while the job ran,")
    print(f"   {armed} of them armed: started then too, the restart gave it its go)")

    process_values = [ms(s["user"] - s["exit"]) for s in process]
    ok = median(process_values) <= PROCESS_TARGET_MS
    verdicts.append((f"process level <= {PROCESS_TARGET_MS} ms", ok))
    row(
        "(d) console process level: exit -> running",
        process_values,
        bare_ms,
        docker_ms[1],
        f"<= {PROCESS_TARGET_MS} {'MET' if ok else 'MISSED'}",
    )
    ok = median(process_values) < docker_ms[1]
    verdicts.append(("process level < Docker retry 1", ok))
    bad = [s for s in process if s["level"] != "process" or not s["same_container"]]
    if bad:
        print(f"  warning: {len(bad)} process-level samples were not restarted in place: {bad}")

    breakdown(
        "(c) where the time goes, restarts that took an armed standby",
        [s for s in container if s["armed"]],
        [
            *DECIDED,
            ("next attempt created -> job's first line (commit, take-over, go, checks)", "next_created", "user"),
        ],
    )
    breakdown(
        "(c) where the time goes, restarts that started a standby",
        [s for s in container if s["standby"] and not s["armed"]],
        [
            *DECIDED,
            ("next attempt created -> `start` event (commit, re-check, start)", "next_created", "start"),
            ("`start` -> user process's first line (launcher env checks)", "start", "user"),
        ],
    )
    breakdown(
        "(c) where the time goes, container restarts that created their container",
        [s for s in container if not s["standby"]],
        [
            *DECIDED,
            ("next attempt created -> `create` event (commit, stage, create)", "next_created", "create"),
            ("`create` -> `start` event (docker start)", "create", "start"),
            ("`start` -> user process's first line (launcher env checks)", "start", "user"),
        ],
    )
    breakdown(
        "(d) where the time goes, process level",
        process,
        [
            ("process's last line -> launcher's exit marker", "exit", "marker"),
            ("exit marker -> task run ended in the DB (follower)", "marker", "detected"),
            ("task run ended -> next attempt created (classify, decide)", "detected", "next_created"),
            ("next attempt created -> launcher restarts (commit, decision, FIFO wake)", "next_created", "launcher"),
            ("launcher restarts -> user process's first line", "launcher", "user"),
            ("(next attempt created -> attempt started in the DB)", "next_created", "next_started"),
        ],
    )

    trace_breakdown(trace, [(s["die"], s["user"]) for s in container], "(c) from death to the job again")
    if container:
        middle = sorted(container, key=lambda s: s["user"] - s["die"])[len(container) // 2]
        print("\n(c) the median restart's timeline: the worker's Docker calls from the death (ms after it)")
        for t0, t1, thread, method, endpoint in trace:
            if middle["die"] - 50e6 <= t0 <= middle["user"] and "/events" not in endpoint:
                at, until = ms(t0 - middle["die"]), ms(t1 - middle["die"])
                print(f"  {at:7.1f} {until:7.1f}  {thread:<22} {method} {endpoint}")
        for label, key in (("attempt ended", "attempt_ended"), ("next attempt created", "next_created")):
            print(f"  {ms(middle[key] - middle['die']):7.1f}          {label} (database)")
    trace_breakdown(trace, [(s["exit"], s["user"]) for s in process], "(d) from the exit to the restarted process")
    if process:
        middle = sorted(process, key=lambda s: s["user"] - s["exit"])[len(process) // 2]
        print("\n(d) the median process restart's timeline: the worker's calls from the exit (ms after it)")
        for t0, t1, thread, method, endpoint in trace:
            if middle["marker"] <= t1 and t0 <= middle["launcher"] and "/events" not in endpoint:
                at, until = ms(t0 - middle["exit"]), ms(t1 - middle["exit"])
                print(f"  {at:7.1f} {until:7.1f}  {thread:<22} {method} {endpoint}")
        for label, key in (("task run ended", "detected"), ("next attempt created", "next_created")):
            print(f"  {ms(middle[key] - middle['exit']):7.1f}          {label} (database)")
        print(f"  {ms(middle['launcher'] - middle['exit']):7.1f}          launcher restarts (its log line)")

    print("\n(e) a container start step by step (median ms; the console creates a new container per restart):")
    for key, values in steps.items():
        print(f"  {key:<62} {median(values):8.1f}   (n={len(values)}, {min(values):.1f}-{max(values):.1f})")

    print("\ntargets:")
    for name, met in verdicts:
        print(f"  {'MET   ' if met else 'MISSED'} {name}")
    if "Traceback" in worker_log:
        print(f"\nthe worker logged errors:\n{worker_log}")
    return 0 if all(met for _, met in verdicts) else 1
