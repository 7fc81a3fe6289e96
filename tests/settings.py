"""The console's settings for the test sessions: console.settings, with one change.

Passwords are hashed by PBKDF2 as in production, with 1,000 iterations instead of Django's
1,000,000: each hash took ~0.5 s of CPU on the 2-CPU test machine, and the suite's logins and
users made ~300 of them (in the test processes and in daphne; docs/decisions.md, "The suite in
layers", has what it saved).
Every login still checks a real PBKDF2 hash through Django's own path; a console started the way
an operator starts one (tests/test_production_walkthrough.py) uses console.settings itself.
"""

from console.settings import *  # noqa: F403

PASSWORD_HASHERS = ["tests.hashers.QuickPBKDF2PasswordHasher"]
