"""Field rules of SPEC §3 that more than one model or form uses."""

import re

from django.core.validators import RegexValidator

JOB_NAME_RULE = "1-64 characters: letters, digits, '-' and '_'"
job_name_validator = RegexValidator(r"^[A-Za-z0-9_-]{1,64}$", f"Name must be {JOB_NAME_RULE}.")

# Docker's reference grammar (distribution/reference), lower-case repository
# path, optional registry host:port, tag and digest.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*"
_DOMAIN = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]+)?/)"
IMAGE_REFERENCE_RE = re.compile(
    rf"^{_DOMAIN}?{_COMPONENT}(?:/{_COMPONENT})*(?::[\w][\w.-]{{0,127}})?(?:@sha256:[a-f0-9]{{64}})?$"
)
IMAGE_RULE = "a Docker image reference such as 'name:tag' or 'registry:5000/team/name:tag' (lower-case path)"
image_reference_validator = RegexValidator(IMAGE_REFERENCE_RE, f"Image must be {IMAGE_RULE}.")

MAX_RESTARTS_MIN, MAX_RESTARTS_MAX = 1, 128
NODE_COUNT_MIN, NODE_COUNT_MAX = 1, 64
POD_RETRY_MAX = 128
EMAIL_RE = re.compile(r"^[^@\s,]+@[^@\s,]+\.[^@\s,]+$")
