"""A worker leaves what it loaded at startup out of every later garbage collection and collects
the young generation less often (console/celery.py; docs/decisions.md "Garbage collections beside
200 followers"). In a process of its own: a freeze would keep this test process's objects."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PROBE = """
import gc, json
import django
django.setup()
import console.celery as worker
before = gc.get_freeze_count()
worker.app.loader.import_default_modules()  # the tasks, as a worker has them when ready
worker.freeze_what_startup_made()
print(json.dumps({"before": before, "frozen": gc.get_freeze_count(), "threshold": gc.get_threshold()}))
"""


def test_a_ready_worker_freezes_what_it_loaded_and_collects_less_often():
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    ).stdout
    probe = json.loads(out.strip().splitlines()[-1])
    assert probe["before"] == 0
    assert probe["frozen"] > 50_000  # Django, the SDKs and the project: most of a worker's objects
    assert tuple(probe["threshold"]) == (20_000, 10, 10)
