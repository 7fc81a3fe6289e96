"""The test sessions' password hasher (tests/settings.py says why)."""

from django.contrib.auth.hashers import PBKDF2PasswordHasher


class QuickPBKDF2PasswordHasher(PBKDF2PasswordHasher):
    # The same algorithm name: a hash made here is a production hash with fewer iterations
    # (a production console would verify it, and re-hash it at the next login).
    iterations = 1_000
