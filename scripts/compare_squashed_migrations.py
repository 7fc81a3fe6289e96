"""Check that jobs' squashed migration and the 21 it replaces end in the same schema.

    .venv/bin/python scripts/compare_squashed_migrations.py

Migrates two new databases of each kind the console runs on (PostgreSQL at DATABASE_URL's server,
SQLite under a temporary folder): one by the migrations the squash replaces (Django's loader told
not to use replacements), one by the squash, as a new install gets it. Then it compares what the
databases say of their tables: columns (type, length, null), constraints and indexes. Column order
is left out: the old chain added columns at the end of a table. Prints SAME or the differences and
exits 1. Not part of the suite: both sides are frozen (new migrations follow the squash), so one
check when the squash was made holds (docs/decisions.md "jobs' migrations squashed").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SQUASH = ("jobs", "0001_squashed_0021")
SERVER = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/console").rsplit("/", 1)[0]

MIGRATE_BY_THE_OLD_CHAIN = f"""
import django
django.setup()
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.loader import MigrationLoader
executor = MigrationExecutor(connection)
executor.loader = MigrationLoader(connection, replace_migrations=False)
targets = [key for key in executor.loader.graph.leaf_nodes() if key != {SQUASH!r}]
plan = executor.migration_plan(targets, clean_start=True)
assert {SQUASH!r} not in [(m.app_label, m.name) for m, _ in plan], "the old chain's plan holds the squash"
executor.migrate(targets, plan=plan)
"""

DESCRIBE_POSTGRESQL = """
import django, json
django.setup()
from django.db import connection
with connection.cursor() as c:
    c.execute("select table_name, column_name, data_type, character_maximum_length, numeric_precision,"
              " is_nullable, column_default from information_schema.columns where table_schema = 'public'")
    columns = c.fetchall()
    c.execute("select conrelid::regclass::text, conname, pg_get_constraintdef(oid) from pg_constraint"
              " where connamespace = 'public'::regnamespace")
    constraints = c.fetchall()
    c.execute("select tablename, indexname, indexdef from pg_indexes where schemaname = 'public'")
    indexes = c.fetchall()
print(json.dumps({"columns": columns, "constraints": constraints, "indexes": indexes}))
"""

DESCRIBE_SQLITE = """
import django, json
django.setup()
from django.db import connection
described = {"columns": [], "indexes": [], "foreign keys": []}
with connection.cursor() as c:
    tables = [r[0] for r in c.execute("select name from sqlite_master where type = 'table'"
                                      " and name not like 'sqlite_%'").fetchall()]
    for t in tables:
        described["columns"] += [[t, *r[1:]] for r in c.execute(f'pragma table_info("{t}")').fetchall()]
        for r in c.execute(f'pragma index_list("{t}")').fetchall():
            columns = [x[2] for x in c.execute(f'pragma index_info("{r[1]}")').fetchall()]
            name = "(automatic)" if r[1].startswith("sqlite_autoindex") else r[1]
            described["indexes"].append([t, name, r[2], columns])
        for r in c.execute(f'pragma foreign_key_list("{t}")').fetchall():
            described["foreign keys"].append([t, *r[2:5], r[6]])
print(json.dumps(described))
"""


def _python(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [str(ROOT / ".venv/bin/python"), *args], cwd=ROOT, env=env, check=True, capture_output=True, text=True
    )
    return done.stdout


def _environment(**settings: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    return {**env, "DJANGO_SETTINGS_MODULE": "console.settings", **settings}


def _describe_both(kind: str, env_of: dict[str, dict[str, str]], describe: str) -> dict[str, dict]:
    described = {}
    for side, env in env_of.items():
        if side == "old chain":
            _python(env, "-c", MIGRATE_BY_THE_OLD_CHAIN)
        _python(env, "manage.py", "migrate", "--noinput", "-v0")  # the squash (or the rest after the chain)
        described[side] = json.loads(_python(env, "-c", describe))
        print(f"{kind}, {side}: " + ", ".join(f"{len(v)} {k}" for k, v in described[side].items()))
    return described


def _differences(described: dict[str, dict]) -> list[str]:
    old, new = described["old chain"], described["squash"]
    found = []
    for what in old:
        before = {json.dumps(row) for row in old[what]}
        after = {json.dumps(row) for row in new[what]}
        found += [f"  {what}, only by the old chain: {row}" for row in sorted(before - after)]
        found += [f"  {what}, only by the squash: {row}" for row in sorted(after - before)]
    return found


def main() -> int:
    found = []
    names = {"old chain": "squash_check_old_chain", "squash": "squash_check_squash"}
    for name in names.values():
        subprocess.run(
            [
                "psql",
                f"{SERVER}/postgres",
                "-q",
                "-c",
                f"drop database if exists {name}",
                "-c",
                f"create database {name}",
            ],
            check=True,
        )
    try:
        envs = {side: _environment(DATABASE_URL=f"{SERVER}/{name}") for side, name in names.items()}
        found += _differences(_describe_both("PostgreSQL", envs, DESCRIBE_POSTGRESQL))
    finally:
        for name in names.values():
            subprocess.run(["psql", f"{SERVER}/postgres", "-q", "-c", f"drop database if exists {name}"], check=False)
    with tempfile.TemporaryDirectory() as tmp:
        envs = {side: _environment(CONSOLE_VAR_DIR=str(Path(tmp) / side.replace(" ", "-"))) for side in names}
        for env in envs.values():
            Path(env["CONSOLE_VAR_DIR"]).mkdir()
        found += _differences(_describe_both("SQLite", envs, DESCRIBE_SQLITE))
    print("\n".join(found) if found else "SAME")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
