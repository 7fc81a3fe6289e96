"""A thread gives its pooled database connection back before it waits.

The worker's threads (Celery's 32, the followers, the publisher, the samplers) share a pool of
CONSOLE_DB_POOL_SIZE connections (console/settings.py). A thread that kept its connection while it
waited on the engine held one of a few for seconds: 190 jobs submitted at once (200 containers
created, started and given standbys) kept the pool taken for over 30 s, and followers and a
standby's preparation failed with PoolTimeout (bench/README.md, "supervisor_scale on 2026-12-02").
So every call at the engine's edge (engine._edge) and a follower between its writes give the
connection back first; the next query takes one from the pool again (no new connection).
"""

from __future__ import annotations

from django.db import connection


def release_connection_if_pooled() -> None:
    """Give this thread's connection back to the pool, unless a transaction is open on it (its
    work is not committed yet: the transaction keeps its connection, whatever it waits on)."""
    if connection.connection is None or connection.in_atomic_block:
        return
    if connection.settings_dict.get("OPTIONS", {}).get("pool"):
        connection.close()
