"""How many interactive sessions (browser terminals, SSH relays) one user may hold open at once
in one console process.

Each session holds a thread of the web process and an exec in the instance's container for as
long as it lasts. Without a bound, one user's script opening sockets in a loop would use up the
console's threads for everyone on it. Counted per process: a console with several web processes
allows that many in each (the bound is against exhaustion, not a quota). The app proxy's
requests and sockets have their own bound (jobs/proxy/http.py `slots`).
"""

from __future__ import annotations

import threading
from collections import Counter

from django.conf import settings

_lock = threading.Lock()
_open: Counter[int] = Counter()


def limit() -> int:
    return settings.SESSIONS_PER_USER


def take(user_id: int) -> bool:
    """Count one more session of this user; False (nothing counted) when they hold the limit."""
    with _lock:
        if _open[user_id] >= limit():
            return False
        _open[user_id] += 1
        return True


def give_back(user_id: int) -> None:
    with _lock:
        _open[user_id] -= 1
        if _open[user_id] <= 0:
            del _open[user_id]
