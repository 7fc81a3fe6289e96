"""The shape of the code, checked: faulttolerance/ decides, jobs/runtime/ acts, and the arrow
points one way (faulttolerance/ never imports jobs/runtime/ nor talks to Docker)."""

import ast
from pathlib import Path

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
