"""Field rules of SPEC §3: the limits, their messages and the checks that more than one
model, the form or the API use.

Every message names the field and the limit. The limits are module constants so that
a test (or an operator's fork) can change one in a single place.
"""

from __future__ import annotations

import posixpath
import re

from django.core.exceptions import ValidationError
from django.core.validators import RegexValidator
from django.utils.deconstruct import deconstructible
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from .i18n import lazy_fill

# -- limits ------------------------------------------------------------------------------------------
MAX_RESTARTS_MIN, MAX_RESTARTS_MAX = 1, 128
NODE_COUNT_MIN, NODE_COUNT_MAX = 1, 64
POD_RETRY_MAX = 128
DESCRIPTION_MAX = 256
ENV_MAX = 100
ENV_VALUE_MAX = 4096
MOUNTS_MAX = 15
OBS_MOUNTS_MAX = 1
DATASETS_MAX = 3
TAGS_MAX = 20
TAG_KEY_MAX, TAG_VALUE_MAX = 128, 255
PRIORITY_MIN, PRIORITY_MAX, PRIORITY_DEFAULT = 1, 3, 1
HOURS_MIN, HOURS_MAX = 1, 720
HOUR_PRESETS = (1, 2, 4, 6)
PORT_MIN, PORT_MAX = 1, 65535
MODEL_NAME_MIN, MODEL_NAME_MAX = 2, 128
MODEL_DESCRIPTION_MAX = 256
VERSION_DESCRIPTION_MAX = 256
JOB_NAME_MAX = 64
# Code dir at submission (seed 002): <= 5 GB, <= 1000 files, depth <= 32.
CODE_DIR_MAX_BYTES = 5 * 1024**3
CODE_DIR_MAX_FILES = 1000
CODE_DIR_MAX_DEPTH = 32

# -- container paths -----------------------------------------------------------------------------------
MA_USER_HOME = "/home/ma-user"
DEFAULT_LOCAL_CODE_DIR = "/home/ma-user/modelarts/user-job-dir"
DEFAULT_MUTUAL_TRUST_DIR = "/home/ma-user/.ssh"
DEFAULT_SUMMARY_PATH = "/home/ma-user/summary"
DEFAULT_ARTIFACT_MOUNT_PATH = "/home/ma-user/outputs"
DEFAULT_NFS_OPTIONS = "vers=3,timeo=600,nolock,hard"
# A custom local code dir may be none of these nor below the last three (seed 002).
LOCAL_CODE_DIR_FORBIDDEN = "/home/ma-user"
LOCAL_CODE_DIR_FORBIDDEN_TREES = ("/home/ma-user/modelarts", "/home/ma-user/modelarts-dev", "/home/ma-user/infer")
# Mount paths (file systems, the object storage mount, TensorBoard / MindStudio Insight).
MOUNT_FORBIDDEN = ("/", "/cache")
MOUNT_FORBIDDEN_TREES = ("/home/ma-user/modelarts",)
# What the platform itself mounts or the kernel owns (jobs/runtime/docker_hosts.py).
PLATFORM_TREES = ("/job-data", "/etc/volcano", "/etc/hosts", "/.console", "/proc", "/sys", "/dev")
# The artifact mount path may not be one of these system directories (seed 002).
ARTIFACT_MOUNT_FORBIDDEN = ("/", "/home", "/home/ma-user", "/home/ma-user/modelarts")

# -- names -----------------------------------------------------------------------------------------------
# The rules are shown in help texts and inside messages: lazy, in the language of the page or request.
JOB_NAME_RULE = lazy_fill(_("1-%(max)s characters: letters, digits, '-' and '_'"), max=JOB_NAME_MAX)
JOB_NAME_RE = rf"^[A-Za-z0-9_-]{{1,{JOB_NAME_MAX}}}$"
job_name_validator = RegexValidator(JOB_NAME_RE, lazy_fill(_("Name must be %(rule)s."), rule=JOB_NAME_RULE))

CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
DESCRIPTION_RULE = lazy_fill(
    _("0-%(max)s characters: letters, CJK characters, digits, space, '-', '_', ',', '.', '，' and '。'"),
    max=DESCRIPTION_MAX,
)
DESCRIPTION_RE = re.compile(rf"^[A-Za-z0-9{CJK} _\-,.，。]*$")


def validate_description(value: str) -> None:
    if value and (len(value) > DESCRIPTION_MAX or not DESCRIPTION_RE.match(value)):
        bad = sorted({c for c in value if not DESCRIPTION_RE.match(c)})
        if bad:
            message = gettext("Description must be %(rule)s (not allowed: %(bad)s).")
        else:
            message = gettext("Description must be %(rule)s (it has %(length)s).")
        params = {"rule": DESCRIPTION_RULE, "bad": " ".join(repr(c) for c in bad), "length": len(value)}
        raise ValidationError(message % params, code="description")


MODEL_NAME_RULE = lazy_fill(
    _(
        "%(min)s-%(max)s characters of CJK characters, letters, digits, '-' and '_', "
        "starting with a CJK character or a letter and ending with a CJK character, a letter or a digit"
    ),
    min=MODEL_NAME_MIN,
    max=MODEL_NAME_MAX,
)
MODEL_NAME_RE = re.compile(rf"^[A-Za-z{CJK}][A-Za-z0-9_\-{CJK}]*[A-Za-z0-9{CJK}]$")


def validate_model_name(value: str) -> None:
    if not (MODEL_NAME_MIN <= len(value) <= MODEL_NAME_MAX) or not MODEL_NAME_RE.match(value):
        raise ValidationError(gettext("Model name must be %(rule)s.") % {"rule": MODEL_NAME_RULE}, code="model_name")


ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# The platform sets these in every container (SPEC §8, jobs/runtime/docker_hosts.py) and owns every MA_*
# name (MA_JOB_DIR, MA_ATTEMPT, ... and those it adds later): a job may not override them.
PLATFORM_ENV_NAMES = frozenset({"VC_TASK_INDEX", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"})
PLATFORM_ENV_PREFIXES = ("MA_",)

TAG_RE = re.compile(rf"^[A-Za-z0-9{CJK} _.:=+\-@/]*$")
TAG_RULE = _("letters, digits, CJK characters, space and _ . : = + - @ /")

# -- objects chosen by name ------------------------------------------------------------------------------
# The form and the API name these objects, never by id: field -> (what, whose). With "owner" only the
# caller's own count, so the message says "you have no ..." rather than that none exists.
NAMED_OBJECTS: dict[str, tuple[str, str | None]] = {
    "flavor": ("Flavor", None),
    "pool": ("Resource pool", None),
    "preset_image": ("Preset image", None),
    "preset_template": ("Preset template", None),
    "observe_file_system": ("File system", None),
    "ssh_key_pair": ("key pair", "owner"),
    "publish_model": ("model", "owner"),
    "base_model": ("model", "owner"),
}
# Each field's message whole (a %(value)s placeholder: the name), so that a translation can put the
# words in its own order; lazy: the form's field keeps it for every request.
NAMED_OBJECT_MISSING = {
    "flavor": _("Flavor '%(value)s' does not exist."),
    "pool": _("Resource pool '%(value)s' does not exist."),
    "preset_image": _("Preset image '%(value)s' does not exist."),
    "preset_template": _("Preset template '%(value)s' does not exist."),
    "observe_file_system": _("File system '%(value)s' does not exist."),
    "ssh_key_pair": _("You have no key pair named '%(value)s'."),
    "publish_model": _("You have no model named '%(value)s'."),
    "base_model": _("You have no model named '%(value)s'."),
}


def named_object_missing(field: str):
    """The message for a name that matches no object of `field` (a %(value)s placeholder: the name)."""
    return NAMED_OBJECT_MISSING[field]


# -- object storage paths (SPEC §8: obs://bucket/path/) ---------------------------------------------------
OBS_BUCKET = r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]"
OBS_DIR_RE = re.compile(rf"^obs://(?P<bucket>{OBS_BUCKET})/(?P<key>(?:[^/\x00-\x1f]+/)*)$")
OBS_DIR_RULE = _("an object storage folder 'obs://bucket/path/' (starting with obs:// and ending with '/')")


def parse_obs_dir(value: str) -> tuple[str, str] | None:
    """(bucket, key) of an `obs://bucket/path/` folder, or None when it is not one."""
    if not isinstance(value, str):
        return None
    match = OBS_DIR_RE.match(value)
    if not match:
        return None
    key = match["key"]
    if any(part in (".", "..") for part in key.split("/")):
        return None
    return match["bucket"], key


@deconstructible
class _LabelledValidator:
    """A validator whose message names the field (`label`); deconstructible for migrations."""

    def __init__(self, label: str):
        self.label = label

    def __eq__(self, other) -> bool:
        return type(self) is type(other) and self.label == other.label

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.label))


class obs_dir_validator(_LabelledValidator):  # noqa: N801 - used like a function
    def __call__(self, value: str) -> None:
        if value and parse_obs_dir(value) is None:
            params = {"label": self.label, "rule": OBS_DIR_RULE, "value": value}
            raise ValidationError(gettext("%(label)s must be %(rule)s; got '%(value)s'.") % params, code="obs_dir")


# -- container paths ---------------------------------------------------------------------------------------
_PATH_RE = re.compile(r"^/[A-Za-z0-9._/-]*$")


def normalized_path(value: str) -> str | None:
    """The absolute path without a trailing '/', or None when it is not a plain absolute path
    (relative, '..' or '.' parts, '//', characters other than letters, digits, '.', '_', '-')."""
    if not isinstance(value, str) or not value or not _PATH_RE.match(value) or "//" in value:
        return None
    parts = value.strip("/").split("/")
    if any(p in (".", "..") for p in parts if p):
        return None
    return posixpath.normpath(value) if value != "/" else "/"


def _within(path: str, tree: str) -> bool:
    return path == tree or path.startswith(tree + "/")


def validate_local_code_dir(value: str) -> None:
    if value == DEFAULT_LOCAL_CODE_DIR:
        return
    path = normalized_path(value)
    message = gettext(
        "Local code dir must be an absolute path (letters, digits, '.', '_', '-') that is not "
        "%(forbidden)s nor under %(trees)s (default %(default)s); got '%(value)s'."
    ) % {
        "forbidden": LOCAL_CODE_DIR_FORBIDDEN,
        "trees": ", ".join(t + "/" for t in LOCAL_CODE_DIR_FORBIDDEN_TREES),
        "default": DEFAULT_LOCAL_CODE_DIR,
        "value": value,
    }
    if path is None or path == "/" or path == LOCAL_CODE_DIR_FORBIDDEN:
        raise ValidationError(message, code="local_code_dir")
    if any(_within(path, tree) for tree in LOCAL_CODE_DIR_FORBIDDEN_TREES):
        raise ValidationError(message, code="local_code_dir")


MOUNT_PATH_RULE = lazy_fill(
    _(
        "an absolute path (letters, digits, '.', '_', '-') that is not / nor /cache, "
        "not /home/ma-user/modelarts or below it, and not a platform path (%(platform)s)"
    ),
    platform=", ".join(PLATFORM_TREES),
)


def mount_path_error(value: str, label=None) -> str | None:
    """Why `value` cannot be a mount path in a job's containers, or None."""
    label = gettext("Mount path") if label is None else label
    path = normalized_path(value)
    if (
        path is None
        or path in MOUNT_FORBIDDEN
        or any(_within(path, tree) for tree in MOUNT_FORBIDDEN_TREES + PLATFORM_TREES)
    ):
        return gettext("%(label)s must be %(rule)s; got '%(value)s'.") % {
            "label": label,
            "rule": MOUNT_PATH_RULE,
            "value": value,
        }
    return None


class mount_path_validator(_LabelledValidator):  # noqa: N801 - used like a function
    def __call__(self, value: str) -> None:
        if value and (message := mount_path_error(value, self.label)):
            raise ValidationError(message, code="mount_path")


ARTIFACT_MOUNT_RULE = lazy_fill(
    _("an absolute path of letters, digits, '-', '_' and '/', not %(forbidden)s (system directories)"),
    forbidden=", ".join(p if p == "/" else p + "/" for p in ARTIFACT_MOUNT_FORBIDDEN),
)
_ARTIFACT_MOUNT_RE = re.compile(r"^/[A-Za-z0-9_/-]*$")


def validate_artifact_mount_path(value: str) -> None:
    if not value:
        return
    path = normalized_path(value) if _ARTIFACT_MOUNT_RE.match(value) else None
    if path is None or path in ARTIFACT_MOUNT_FORBIDDEN:
        message = gettext("Artifact mount path must be %(rule)s; got '%(value)s'.")
        raise ValidationError(message % {"rule": ARTIFACT_MOUNT_RULE, "value": value}, code="mount_path")
    if message := mount_path_error(value, gettext("Artifact mount path")):
        raise ValidationError(message, code="mount_path")


class validate_directory(_LabelledValidator):  # noqa: N801 - used like a function
    def __call__(self, value: str) -> None:
        path = normalized_path(value or "")
        if value and (path is None or path == "/"):
            message = gettext(
                "%(label)s must be an absolute directory other than / (letters, digits, '.', '_', '-'); "
                "got '%(value)s'."
            )
            raise ValidationError(message % {"label": self.label, "value": value}, code="directory")


NFS_OPTION_RE = re.compile(r"^[A-Za-z0-9_]+(?:=[A-Za-z0-9_.:/-]+)?$")
# The NFS options (nfs(5)) a job may set: how the mount talks to the operator's server, never where
# the server is. The address is the file system's (staging.nfs_mount writes `addr=<server>` first);
# a job's own `addr=` (the kernel takes the last), `clientaddr`, `port`, `mountaddr`, `mountport`,
# `mountproto` or `mounthost` would point the mount that the engine makes, as root on the host's
# network, at another server or at the host's loopback.
NFS_OPTIONS_ALLOWED = (
    "vers", "nfsvers", "minorversion", "proto", "timeo", "retrans", "hard", "soft", "softerr", "nolock", "lock",
    "local_lock", "rsize", "wsize", "ac", "noac", "actimeo", "acregmin", "acregmax", "acdirmin", "acdirmax",
    "cto", "nocto", "lookupcache", "nconnect", "sec", "intr", "nointr", "noatime", "nodiratime", "relatime",
    "resvport", "noresvport", "sharecache", "nosharecache", "fsc", "nofsc",
    # and the generic ones vendors' fstab lines carry (NetApp, Filestore: rw, tcp, async, ...)
    "rw", "ro", "tcp", "udp", "rdma", "sync", "async", "bg", "fg", "retry", "nosuid", "nodev", "noexec",
    "rdirplus", "nordirplus", "acl", "noacl",
)  # fmt: skip


def nfs_options_error(value: str) -> str | None:
    options = [opt.strip() for opt in (value or "").split(",")]
    bad = [opt for opt in options if not NFS_OPTION_RE.match(opt)]
    if bad:
        return gettext(
            "Mount options must be comma-separated NFS options like '%(example)s'; not an option: %(bad)s."
        ) % {"example": DEFAULT_NFS_OPTIONS, "bad": ", ".join(repr(b) for b in bad)}
    refused = [opt for opt in options if opt.partition("=")[0] not in NFS_OPTIONS_ALLOWED]
    if refused:
        return gettext(
            "Mount options cannot set %(refused)s: where the server is belongs to the file system; "
            "a job may set %(allowed)s."
        ) % {"refused": ", ".join(repr(o) for o in refused), "allowed": ", ".join(NFS_OPTIONS_ALLOWED)}
    return None


# -- hours ------------------------------------------------------------------------------------------------
def hours_error(label, value, empty=None) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not (HOURS_MIN <= value <= HOURS_MAX):
        return gettext(
            "%(label)s must be %(presets)s or a custom %(min)s-%(max)s hours (empty: %(empty)s); got %(value)s."
        ) % {
            "label": label,
            "presets": ", ".join(str(h) for h in HOUR_PRESETS),
            "min": HOURS_MIN,
            "max": HOURS_MAX,
            "empty": gettext("off") if empty is None else empty,
            "value": value,
        }
    return None


# -- images ------------------------------------------------------------------------------------------------
# Docker's reference grammar (distribution/reference), lower-case repository
# path, optional registry host:port, tag and digest.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*"
_DOMAIN = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]+)?/)"
IMAGE_REFERENCE_RE = re.compile(
    rf"^{_DOMAIN}?{_COMPONENT}(?:/{_COMPONENT})*(?::[\w][\w.-]{{0,127}})?(?:@sha256:[a-f0-9]{{64}})?$"
)
IMAGE_RULE = _("a Docker image reference such as 'name:tag' or 'registry:5000/team/name:tag' (lower-case path)")
image_reference_validator = RegexValidator(IMAGE_REFERENCE_RE, lazy_fill(_("Image must be %(rule)s."), rule=IMAGE_RULE))

EMAIL_RE = re.compile(r"^[^@\s,]+@[^@\s,]+\.[^@\s,]+$")

SSH_PUBLIC_KEY_RE = re.compile(
    r"^(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(256|384|521)|sk-ssh-ed25519@openssh\.com) [A-Za-z0-9+/]+={0,3}( [^\n]*)?$"
)


def validate_ssh_public_key(value: str) -> None:
    if not SSH_PUBLIC_KEY_RE.match((value or "").strip()):
        raise ValidationError(
            gettext("Public key must be one OpenSSH public key line ('ssh-ed25519 AAAA... comment')."),
            code="public_key",
        )


# -- env vars -------------------------------------------------------------------------------------------------
def env_name_error(name) -> str | None:
    if not isinstance(name, str) or not ENV_NAME_RE.match(name):
        return gettext("'%(name)s' is not a valid name: letters, digits and '_', not starting with a digit") % {
            "name": name
        }
    if name in PLATFORM_ENV_NAMES or name.startswith(PLATFORM_ENV_PREFIXES):
        return gettext("'%(name)s' is set by the platform (as are all MA_* names) and cannot be overridden") % {
            "name": name
        }
    return None


ENV_FILE_LINE_RE = re.compile(r"^\s*(?:export\s+)?([^=\s]+)\s*=(.*)$")


def parse_env_file(text: str, existing: int = 0) -> list[dict]:
    """Env vars from a file of KEY=VALUE lines (blank lines and # comments skipped, optional
    `export `, optional matching quotes around the value), for the batch import of SPEC §3.

    The import is all or nothing: a bad line, a bad or repeated name, or a total (with the
    `existing` variables of the job) over ENV_MAX refuses the whole file.
    """
    rows: list[dict] = []
    problems: list[str] = []
    seen: set[str] = set()
    for number, line in enumerate((text or "").splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = ENV_FILE_LINE_RE.match(line)
        if not match:
            problems.append(gettext("line %(number)s is not KEY=VALUE") % {"number": number})
            continue
        name, value = match[1], match[2].strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        if error := env_name_error(name):
            problems.append(gettext("line %(number)s: %(error)s") % {"number": number, "error": error})
        elif name in seen:
            problems.append(gettext("line %(number)s: '%(name)s' is repeated") % {"number": number, "name": name})
        seen.add(name)
        rows.append({"name": name, "value": value, "sensitive": False})
    if existing + len(rows) > ENV_MAX:
        message = gettext(
            "Env var import refused: the file has %(rows)s variables and the job already has %(existing)s; "
            "at most %(max)s env vars in total. Nothing was imported."
        )
        raise ValidationError(message % {"rows": len(rows), "existing": existing, "max": ENV_MAX}, code="env_import")
    if problems:
        message = gettext("Env var import refused, nothing was imported: %(problems)s.")
        raise ValidationError(message % {"problems": "; ".join(problems[:5])}, code="env_import")
    return rows
