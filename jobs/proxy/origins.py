"""Which app of which instance a host name names, and the URL of that origin."""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass

from django.conf import settings


@dataclass(frozen=True)
class App:
    key: str  # the host label's prefix
    name: str  # what a person reads
    port: int  # where the launcher starts it on the instance's loopback
    field: str  # the job's switch (TrainingJob)


APPS: dict[str, App] = {
    "lab": App("lab", "JupyterLab", 8888, "jupyter_lab"),
    "tb": App("tb", "TensorBoard", 6006, "tensorboard"),
}
_LABEL = re.compile(r"^(lab|tb)-([0-9a-f]{32})-(\d{1,3})$")


@dataclass(frozen=True)
class Target:
    app: App
    job_id: uuid.UUID
    index: int

    @property
    def label(self) -> str:
        return f"{self.app.key}-{self.job_id.hex}-{self.index}"


def domain() -> str:
    return settings.APPS_DOMAIN.strip(".").lower()


def target_of(host: str) -> Target | None:
    """The app a Host header names, or None when it is not an app origin of this console."""
    name = host.strip().lower()
    if name.startswith("["):  # an IPv6 literal is never an app origin
        return None
    name = name.rsplit(":", 1)[0] if ":" in name else name
    suffix = "." + domain()
    if not name.endswith(suffix):
        return None
    found = _LABEL.match(name[: -len(suffix)])
    if not found:
        return None
    return Target(APPS[found.group(1)], uuid.UUID(found.group(2)), int(found.group(3)))


def origin(target: Target, *, scheme: str, console_host: str) -> str:
    """The app's origin beside the console's: same scheme and port as the page the user is on."""
    port = ""
    if not console_host.startswith("[") and ":" in console_host:
        port = ":" + console_host.rsplit(":", 1)[1]
    elif console_host.startswith("[") and "]:" in console_host:
        port = ":" + console_host.rsplit("]:", 1)[1]
    return f"{scheme}://{target.label}.{domain()}{port}"
