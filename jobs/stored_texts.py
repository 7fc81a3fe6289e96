"""The known table of texts the console stores in English (jobs/stored_text.py translates them).

Each entry is the English the named module builds, with its parts as %(name)s placeholders:
an event's message, a job's reason, a recovery record's explanation and decision, an instance's
error. The modules keep building their English (the API, webhooks and logs carry it as it is);
tests/test_i18n_catalog.py checks that every entry's words still occur in the module it names,
so a reworded message shows up there rather than silently staying English on a Chinese page.
gettext_noop marks them for makemessages: the translation is looked up when a page shows one.
"""

from __future__ import annotations

from django.utils.translation import gettext_noop

BY_MODULE: dict[str, tuple[str, ...]] = {
    # The decision of SPEC §4 (RecoveryRecord.decision, a job's reason) and "What happens if".
    "faulttolerance/policy.py": (
        gettext_noop("restart (%(level)s level): %(reason)s"),
        gettext_noop("end: %(reason)s"),
        gettext_noop("terminated by the user"),
        gettext_noop("preempted: re-queued (consumes nothing)"),
        gettext_noop("fault tolerance is off"),
        gettext_noop("hang restart (does not consume max restarts)"),
        gettext_noop("instance rescheduled to another host (consumes P, not R)"),
        gettext_noop("unconditional restart"),
        gettext_noop("%(failure_class)s is retryable"),
        gettext_noop("max restarts used up (%(used)s/%(max)s)"),
        gettext_noop(
            "%(failure_class)s is not retryable and %(count)s unconditional restarts in a row "
            "did not help (%(used)s/%(max)s used)"
        ),
        gettext_noop("%(failure_class)s is not retryable"),
    ),
    "faulttolerance/whatif.py": (
        gettext_noop("Your code fails (exit 1, a bug)"),
        gettext_noop("Out of memory (OOM-killed)"),
        gettext_noop("NCCL timeout or a process killed from outside"),
        gettext_noop("The job hangs (no log, no CPU/GPU use)"),
        gettext_noop("Its Docker host is lost"),
        gettext_noop("The environment check fails"),
        gettext_noop("1 of %(max)s restarts"),
        gettext_noop("a hang restart (not counted in max restarts)"),
        gettext_noop("1 of %(max)s instance reschedulings"),
        gettext_noop("nothing"),
    ),
    # Log failure analysis: the explanation of each rule (RecoveryRecord.explanation).
    "faulttolerance/classify.py": (
        gettext_noop("No CPU use, no log output (and no GPU use, where there are GPUs) for the whole hang window."),
        gettext_noop("The Docker host became unreachable or the container vanished."),
        gettext_noop("The container could not be started."),
        gettext_noop("The container was killed for using more memory than its limit (OOM)."),
        gettext_noop("A pre-flight environment check failed on this host."),
        gettext_noop("A collective communication timed out or hit a system error (NCCL/HCCL); usually transient."),
        gettext_noop("The GPU reported an ECC error or an Xid event; a hardware fault outside the job."),
        gettext_noop("A connection between instances was reset during a collective."),
        gettext_noop(
            "The image has a link where the console mounts its tools, its control dir, /cache or /etc/volcano: "
            "the launcher refuses to run in it (rebuild the image without those links)."
        ),
        gettext_noop("The training script raised an exception (Python traceback)."),
        gettext_noop("The process was killed by a signal (SIGKILL/SIGTERM/SIGHUP) it did not send itself."),
        gettext_noop("The process exited with a non-zero status and no known signature."),
    ),
    "jobs/runtime/decide.py": (
        gettext_noop("The instance failed."),
        gettext_noop(
            "the environment checks failed on %(first)s and then on %(second)s: two hosts in a row point at the "
            "job's own settings (image, flavor, mounts); no further host is isolated"
        ),
        gettext_noop("Environment check failed on %(host)s: %(lines)s"),
        gettext_noop("%(explanation)s (%(job)s, attempt %(number)s)"),
        gettext_noop("%(failure_class)s: %(decision)s. %(waiting)s"),
        gettext_noop("%(failure_class)s: %(decision)s"),
        gettext_noop("%(failure_class)s (exit code %(code)s): %(detail)s Decision: %(decision)s."),
        gettext_noop("%(failure_class)s: %(detail)s Decision: %(decision)s."),
        gettext_noop("worker-%(index)s moved from %(from_host)s to %(to_host)s."),
        gettext_noop("%(job)s (priority %(priority)s)"),
        gettext_noop("a higher-priority job (since deleted)"),
        gettext_noop("Preempted by %(by)s; queued again with priority %(priority)s."),
        gettext_noop(
            "Preempted by %(by)s, which needed the room on pool %(pool)s; attempt %(number)s stopped and the job "
            "queued again (restarts used stay %(used)s/%(max)s)."
        ),
        gettext_noop(
            "Preempted by %(by)s, which needed the room on pool %(pool)s; attempt %(number)s stopped and the job "
            "queued again."
        ),
        gettext_noop("Stopped by the scheduler to make room for %(by)s on pool %(pool)s."),
        gettext_noop(
            "The console could not decide what follows attempt %(number)s (%(error)s); the job was ended rather "
            "than left running."
        ),
    ),
    "jobs/runtime/start.py": (
        gettext_noop("Started on %(hosts)s."),
        gettext_noop("Attempt %(number)s running (%(level)s level)."),
        gettext_noop(
            "Image '%(image)s' does not exist on host %(host)s. "
            "Images are built locally (no registry): ask an operator to load it, or pick a preset image."
        ),
        gettext_noop("The container to restart in place is gone: %(error)s"),
        gettext_noop("Docker host %(host)s could not be reached: %(error)s"),
        gettext_noop("Docker refused to start the container on host %(host)s: %(error)s"),
        gettext_noop("The console could not start the container: %(error)s"),
        gettext_noop("Stopped while the attempt was starting."),
    ),
    "jobs/runtime/follow.py": (
        gettext_noop("The container vanished (removed outside the console)."),
        gettext_noop("Docker host %(host)s became unreachable: %(error)s"),
        gettext_noop(
            "worker-%(index)s looks stuck: no CPU use, no log output, no GPU use for %(idle)s s (window %(window)s s)."
        ),
        gettext_noop("worker-%(index)s looks stuck: no CPU use, no log output for %(idle)s s (window %(window)s s)."),
    ),
    "jobs/runtime/stop.py": (
        gettext_noop("The job completed."),
        gettext_noop("The job failed."),
        gettext_noop("The job terminated."),
        gettext_noop("Stopped by the user."),
        gettext_noop("Auto stopped after %(hours)s hour of running."),
        gettext_noop("Auto stopped after %(hours)s hours of running."),
        gettext_noop("%(reason)s Containers kept for %(hours)s (retention)."),
        gettext_noop("Containers kept for %(hours)s (retention)."),
        gettext_noop("%(reason)s Containers removed when the user stopped the job."),
        gettext_noop("%(reason)s Containers removed after %(hours)s."),
        gettext_noop("1 hour"),
        gettext_noop("%(count)s hours"),
    ),
    "jobs/runtime/schedule.py": (
        gettext_noop("Terminated before it started."),
        gettext_noop("Queued behind %(job)s (priority %(priority)s), which waits for capacity."),
    ),
    "jobs/runtime/placement.py": (
        gettext_noop("No healthy host in %(scope)s."),
        gettext_noop("No healthy host of %(scope)s is among the affinity hosts (%(hosts)s)."),
        gettext_noop("Every healthy host of %(scope)s is excluded by anti-affinity (%(hosts)s)."),
        gettext_noop(
            "Waiting for capacity: only %(placed)s of %(count)s instances (%(need)s each) fit on the free capacity "
            "of %(scope)s."
        ),
        gettext_noop("Waiting for capacity: %(missing)s."),
        gettext_noop("No host of %(scope)s is large enough for one instance (%(need)s; a node has %(node)s)."),
        gettext_noop(
            "%(count)s instances of %(need)s need more hosts than %(scope)s has: %(fit)s fit on its hosts even when "
            "they are empty."
        ),
        gettext_noop("no host of %(scope)s has %(short)s"),
        gettext_noop("no host of %(scope)s has %(need)s free at once"),
        gettext_noop("pool %(pool)s"),
        gettext_noop("the job's dedicated pool"),
        gettext_noop("the public pools"),
        gettext_noop("Waiting for a healthy Docker host of %(scope)s (%(detail)s)"),
        gettext_noop("Waiting for a healthy Docker host of %(scope)s: none is enabled."),
        gettext_noop("Waiting for a healthy Docker host (%(detail)s)"),
        gettext_noop("Waiting for a healthy Docker host: none is enabled."),
    ),
    "jobs/runtime/preemption.py": (
        gettext_noop("Preempting %(jobs)s to make room."),
        # schedule.py's Pending reason: a placement's reason followed by the one above.
        gettext_noop("%(reason)s Preempting %(jobs)s to make room."),
        gettext_noop("Preempted by %(by)s: stopping its instances to make room."),
    ),
    # Messages of object storage that end up inside a stored text (publish notes, export errors).
    "jobs/storage.py": (
        gettext_noop("%(label)s: bucket '%(bucket)s' is not owned by or granted to workspace '%(workspace)s'."),
        gettext_noop("'%(url)s' does not exist in object storage."),
        gettext_noop("Cannot read '%(url)s': %(why)s."),
    ),
    # The runtime environment preview's "What" and "From" (the wizard and the review).
    "jobs/runtime/layout.py": (
        gettext_noop("local directory of each instance"),
        gettext_noop("Local code dir (MA_JOB_DIR)"),
        gettext_noop("Code folder (copied at each container start)"),
        gettext_noop("dataset %(number)s (missing)"),
        gettext_noop("Dataset %(name)s"),
        gettext_noop("Object storage mount"),
        gettext_noop("(no storage path)"),
        gettext_noop("Artifacts"),
        gettext_noop("job data (persistent)"),
        gettext_noop("Job data (MA_CHECKPOINT_DIR)"),
        gettext_noop("scratch volume of each instance"),
        gettext_noop("Cache"),
        gettext_noop("File system mount"),
        gettext_noop("file system %(name)s:%(folder)s/ (no %(tool)s server is started: view the summaries elsewhere)"),
        gettext_noop("%(tool)s summaries (MA_SUMMARY_DIR)"),
        gettext_noop(
            "key pair generated for this job (id_ed25519, authorized_keys, config): the same in every instance"
        ),
        gettext_noop("Mutual-trust SSH files"),
        gettext_noop("authorized_keys with your key pair %(key)s; sshd is the image's to run"),
        gettext_noop("%(source)s (one instance has no network: nothing can reach it)"),
        gettext_noop("SSH remote development"),
    ),
    "jobs/runtime/lifecycle.py": (gettext_noop("Host %(host)s isolated: %(reason)s"),),
    "jobs/runtime/outputs.py": (
        gettext_noop("Model not published: %(note)s"),
        gettext_noop("Model published: %(model)s %(version)s"),
        gettext_noop("Log export to %(path)s failed: %(error)s"),
        gettext_noop("%(error)s The logs stay in the console."),
        gettext_noop("Logs exported to %(path)s"),
        gettext_noop("Logs deleted by retention, %(after)s after the job ended (keep logs permanently is off)."),
        gettext_noop("the job did not complete: only a completed job publishes."),
        gettext_noop("Publishes when the job completes."),
        gettext_noop("store artifacts is off, so the job has no artifacts to publish."),
        gettext_noop("the model to publish a new version of no longer exists."),
        gettext_noop("no model name was given."),
        gettext_noop("the artifact folder cannot be read: %(error)s"),
        gettext_noop("the artifact folder %(path)s is empty."),
        # duration_text(): the log retention, inside other texts and on the Overview tab.
        gettext_noop("1 day"),
        gettext_noop("%(count)s days"),
        gettext_noop("1 minute"),
        gettext_noop("%(count)s minutes"),
        gettext_noop("1 second"),
        gettext_noop("%(count)s seconds"),
    ),
}

TEMPLATES: tuple[str, ...] = tuple(template for templates in BY_MODULE.values() for template in templates)
