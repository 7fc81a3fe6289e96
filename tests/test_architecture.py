"""The shape of the code, checked: faulttolerance/ decides, jobs/runtime/ acts, and the arrow
points one way (faulttolerance/ never imports jobs/runtime/ nor talks to Docker)."""

import ast
import io
from pathlib import Path

import pytest
from django.core.management import call_command

ROOT = Path(__file__).resolve().parent.parent


def imported_modules(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_faulttolerance_never_imports_the_runtime_nor_docker():
    for path in sorted((ROOT / "faulttolerance").glob("*.py")):
        for module in imported_modules(path):
            assert not module.startswith(("jobs.runtime", "docker", "requests")), f"{path.name} imports {module}"


def application_modules():
    for package in ("console", "jobs", "faulttolerance"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" not in path.parts:
                yield path


def test_only_the_engine_module_talks_to_docker():
    """One Docker boundary (jobs/runtime/engine.py, and engine_clients.py for the clients it hands
    out): the SDK's calls, its errors turned into the console's, its types. Everything else goes
    through it."""
    edge = {ROOT / "jobs" / "runtime" / "engine.py", ROOT / "jobs" / "runtime" / "engine_clients.py"}
    for path in application_modules():
        if path in edge:
            continue
        for module in imported_modules(path):
            assert not module.startswith("docker"), f"{path.relative_to(ROOT)} imports {module}"


def test_tasks_are_queued_by_typed_calls_not_by_name():
    """Work is handed to the worker through jobs/runtime/later.py (a function per task), never by
    a task name looked up at run time: a misspelt task is an error where it is written."""
    from jobs import tasks
    from jobs.runtime import later

    for path in application_modules():
        text = path.read_text()
        assert "getattr(tasks" not in text, f"{path.relative_to(ROOT)} looks a task up by name"
        assert "send_task(" not in text, f"{path.relative_to(ROOT)} sends a task by name"
    for name in dir(later):
        function = getattr(later, name)
        if callable(function) and getattr(function, "__module__", "") == later.__name__ and not name.startswith("_"):
            assert hasattr(tasks, name), f"later.{name} names no task of jobs.tasks"


def test_control_tasks_have_a_queue_of_their_own():
    """Start, stop, decide, schedule and reconcile go to `<queue>.control`, which a worker can
    take alone (README, production): nothing else queued can delay them."""
    from django.conf import settings

    from console.celery import app

    control = {"schedule_job", "start_attempt", "end_attempt", "stop_job", "follow_task_run", "reconcile"}
    housekeeping = {"job_outputs", "delete_job_logs", "release_job_resources", "deliver_notification"}
    for name in control | housekeeping:
        queue = app.amqp.router.route({}, f"jobs.tasks.{name}")["queue"].name
        expected = settings.CELERY_CONTROL_QUEUE if name in control else settings.CELERY_TASK_DEFAULT_QUEUE
        assert queue == expected, (name, queue)
    assert set(app.amqp.queues) == {settings.CELERY_TASK_DEFAULT_QUEUE, settings.CELERY_CONTROL_QUEUE}


@pytest.mark.django_db
def test_the_migrations_make_the_models():
    """The suite's databases are made from the models (pytest.ini: --no-migrations): the
    migrations must make the same tables, or production would run a schema no test saw."""
    out = io.StringIO()
    try:
        call_command("makemigrations", "--check", "--dry-run", stdout=out, stderr=out)
    except SystemExit:
        pytest.fail(f"the models have changes no migration makes:\n{out.getvalue()}")


def test_no_application_module_is_over_500_lines():
    """Modules are split by verb before they grow past 500 lines (the guide's limit): a long
    module is where two jobs start to share one file."""
    for path in application_modules():
        lines = len(path.read_text().splitlines())
        assert lines <= 500, f"{path.relative_to(ROOT)} has {lines} lines"


def test_no_test_or_benchmark_module_is_over_500_lines():
    """The same limit for the suite and the benchmarks: a test file past it holds two subjects."""
    for folder in ("tests", "bench"):
        for path in sorted((ROOT / folder).glob("*.py")):
            lines = len(path.read_text().splitlines())
            assert lines <= 500, f"{path.relative_to(ROOT)} has {lines} lines"


def test_tests_import_helpers_from_modules_not_from_conftest():
    """conftest.py is pytest's (hooks and fixtures); what a test calls lives in a module of its own
    (tests/helpers.py, demo.py, processes.py, second_engine.py, browser_page.py, ...)."""
    for path in sorted((ROOT / "tests").glob("*.py")):
        assert "tests.conftest" not in imported_modules(path), f"{path.relative_to(ROOT)} imports tests.conftest"


def test_no_test_module_imports_another():
    """A test module holds tests; what several use is a fixture (conftest.py) or a helper in a
    module of its own (browser_page.py, wsclient.py, folders.py, bounded_calls.py, ...). Importing
    a test module runs its module-level settings in the importer and made copies of a fixture per
    importing module; helpers kept there were copied rather than found (eight copies of `ended`,
    two of `dedicated_pool`)."""
    for path in sorted((ROOT / "tests").glob("*.py")):
        tests_imported = {m for m in imported_modules(path) if m.startswith("tests.test_")}
        for node in ast.walk(ast.parse(path.read_text())):  # from tests import test_x
            if isinstance(node, ast.ImportFrom) and node.module == "tests" and node.level == 0:
                tests_imported.update(f"tests.{a.name}" for a in node.names if a.name.startswith("test_"))
        assert not tests_imported, f"{path.relative_to(ROOT)} imports {sorted(tests_imported)}"


# What bench/ may import from tests/: modules that change nothing when imported (tests/shared.py).
SHARED_WITH_BENCH = {"tests.shared", "tests.second_engine"}


def test_benchmarks_import_from_the_tests_only_what_changes_nothing_on_import():
    """bench/ reuses the tests' waiting, free port and second engine, and nothing else of tests/:
    tests/pytest_env.py, which helpers.py and processes.py import, gives the importing process a
    test session's database, queue and labels. The shared modules import neither it nor Django,
    nor any other module of tests/ but each other."""
    for path in sorted((ROOT / "bench").glob("*.py")):
        for module in imported_modules(path):
            if module.startswith("tests"):
                assert module in SHARED_WITH_BENCH, f"{path.relative_to(ROOT)} imports {module}"
    for module in sorted(SHARED_WITH_BENCH):
        path = ROOT / (module.replace(".", "/") + ".py")
        for imported in imported_modules(path):
            assert not imported.startswith(("django", "console", "jobs")), f"{module} imports {imported}"
            if imported.startswith("tests"):
                assert imported in SHARED_WITH_BENCH, f"{module} imports {imported}"
