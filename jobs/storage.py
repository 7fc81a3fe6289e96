"""Object storage (SPEC §8): `obs://bucket/path/` on a local directory root.

The default backend maps `obs://bucket/some/path/` to `<OBJECT_STORAGE_ROOT>/bucket/some/path/`
(one folder per bucket). The root is the setting `OBJECT_STORAGE_ROOT`, else the
environment variable `CONSOLE_OBJECT_STORAGE_ROOT`, else `<VAR_DIR>/object-storage`.
An S3-compatible backend can take the same functions later; callers only use what is here.

What the console needs from it:
- `measure(url)`: total size, file and folder count and depth of a folder (the code dir limits of SPEC §3),
- `bucket_exists(url)`: output paths (backup, artifacts, logs) must be in an existing bucket,
- `bucket_allowed` / `buckets_of` / `tenancy_error`: whose a bucket is (a Bucket row: owner and
  grants); the callers ask before they touch a path (they are the gate, the functions below are not),
- `listdir` / `read_text` / `write_text` and `can_edit` / `can_view`: the code dir browser,
- `open_folder` / `confined_path`: what the console does for a job (copies, backups, log
  exports, bind mount sources) walks the path from the bucket folder without following any
  symbolic link (jobs/runtime/hostpaths.py): buckets are written by jobs, and a link a job
  planted must not lead the console (root) anywhere.
"""

from __future__ import annotations

import itertools
import os
import re
import stat
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from django.conf import settings
from django.db import models
from django.utils.translation import gettext

from . import validators as v
from .runtime import hostpaths

EDITABLE_SUFFIXES = (".txt", ".py", ".sh", ".yaml")
VIEWABLE_SUFFIXES = (".log", ".json", ".md")
MAX_TEXT_BYTES = 1024 * 1024  # the browser edits small files only
MAX_NAME_BYTES = 255  # one path part (NAME_MAX of common Linux file systems)


class StorageError(Exception):
    """A path that is not an object storage folder/file, or one that does not exist."""


class NotInStorage(StorageError):
    """The path names nothing in object storage (read_stored)."""


def root() -> Path:
    configured = getattr(settings, "OBJECT_STORAGE_ROOT", None) or os.environ.get("CONSOLE_OBJECT_STORAGE_ROOT")
    if configured:
        return Path(configured)
    return Path(getattr(settings, "VAR_DIR", Path.cwd() / "var")) / "object-storage"


def _split(url: str) -> tuple[str, str]:
    if not isinstance(url, str) or not url.startswith("obs://"):
        raise StorageError(
            gettext("Not an object storage path: '%(url)s' (expected obs://bucket/path/).") % {"url": url}
        )
    bucket, _, key = url.removeprefix("obs://").partition("/")
    if not bucket or not re.fullmatch(v.OBS_BUCKET, bucket):
        raise StorageError(gettext("Not a bucket name: '%(bucket)s' in '%(url)s'.") % {"bucket": bucket, "url": url})
    parts = [p for p in key.split("/") if p]
    if any(p in (".", "..") or "\x00" in p for p in parts):
        raise StorageError(f"'.' and '..' are not allowed in object storage paths: '{url}'.")
    # The file system's own limit; checked here so that it is a clear refusal, not an OSError later.
    if any(len(p.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES for p in parts):
        message = gettext("A name in '%(url)s' is longer than %(max)s bytes.")
        raise StorageError(message % {"url": url, "max": MAX_NAME_BYTES})
    return bucket, "/".join(parts)


def local_path(url: str) -> Path:
    """Where `obs://bucket/path` lies on the local backend (it need not exist).

    Confined to the root: '.'/'..' parts are refused by `_split`, and because the path is
    resolved (symbolic links followed) before the checks, a link anywhere on the way -- the
    bucket folder itself included -- that points out of its bucket is refused too.
    """
    bucket, key = _split(url)
    base = _bucket_dir(bucket, url)
    try:
        path = (base / key).resolve() if key else base
    except RuntimeError:  # links that name each other (a job's `ln -s b a; ln -s a b`)
        raise StorageError(f"'{url}' is a loop of symbolic links.") from None
    if path != base and base not in path.parents:  # a symlink pointing out of the bucket
        raise StorageError(f"'{url}' leaves its bucket.")
    return path


def _bucket_dir(bucket: str, url: str) -> Path:
    """The bucket's folder, resolved: a link in the root itself is the operator's (jobs never
    write the root), but it must stay in the root."""
    top = root().resolve()
    base = (top / bucket).resolve()
    if base.parent != top:  # the bucket folder is a symlink to somewhere else
        raise StorageError(f"'{url}' leaves the object storage root.")
    return base


def _escape(bucket: str, exc: hostpaths.PathEscape) -> StorageError:
    shown = f"obs://{bucket}/{exc.at}" + ("/" if exc.reason == "is a symbolic link" else "")
    return StorageError(
        f"'{shown}' {exc.reason}: the console never follows a link in object storage for a job "
        "(a job may have planted it); remove it or choose another path."
    )


def console_owner(existing: os.stat_result | None = None) -> tuple[int, int] | None:
    """The owner the console gives what it writes in object storage: an existing file's own owner
    (a save never changes it), else settings.STORAGE_OWNER. None when the console cannot chown
    (not root): what it writes is then its own user's."""
    if os.geteuid() != 0:
        return None
    if existing is not None:
        return existing.st_uid, existing.st_gid
    return settings.STORAGE_OWNER


@contextmanager
def open_folder(url: str, *, create: bool = False, owner: tuple[int, int] | None = None) -> Iterator[int]:
    """A descriptor of the folder `url`, opened from its bucket folder one part at a time
    without following links (hostpaths.open_dir): a link anywhere below the bucket is refused
    with a StorageError naming it. `create`: missing folders below the bucket are made (never
    the bucket: that is the user's or the operator's doing); the last one, when made here, is
    given to `owner` (default: the console's owner of object storage, console_owner())."""
    bucket, key = _split(url)
    if create and owner is None:
        owner = console_owner()
    stack = ExitStack()
    try:
        fd = stack.enter_context(hostpaths.open_dir(_bucket_dir(bucket, url), key, create=create, owner=owner))
    except hostpaths.PathEscape as exc:
        raise _escape(bucket, exc) from None
    except FileNotFoundError:
        raise StorageError(gettext("'%(url)s' does not exist in object storage.") % {"url": url}) from None
    except NotADirectoryError:
        raise StorageError(f"'{url}' is not a folder in object storage.") from None
    with stack:
        yield fd


def confined_path(url: str) -> Path:
    """Where `obs://bucket/path` lies (as local_path), checked as open_folder does: no part
    below the bucket folder is a link. A missing tail is allowed. For paths handed on as
    strings (bind mount sources)."""
    bucket, key = _split(url)
    try:
        return hostpaths.confined(_bucket_dir(bucket, url), key)
    except hostpaths.PathEscape as exc:
        raise _escape(bucket, exc) from None
    except NotADirectoryError:
        raise StorageError(f"'{url}' is not a folder in object storage.") from None


def bucket_of(url: str) -> str:
    return _split(url)[0]


# -- who may use a bucket (docs/decisions.md "Workspaces own their storage") ---------------------------------------
# The folders are the data; the Bucket rows (jobs/models/storage.py) say whose they are. Every
# user-facing path (browser, picker, job validation, the runtime) asks here, before touching disk,
# so that a refusal says nothing about what another workspace's bucket holds.
def bucket_allowed(url: str, workspace) -> bool:
    """Whether the bucket of `url` is owned by or granted to `workspace` (a Workspace, its id or None).
    A bucket folder without a Bucket row belongs to nobody: False."""
    from .models import Bucket  # the models import this module

    workspace_id = getattr(workspace, "pk", workspace)
    try:
        name = bucket_of(url)
    except StorageError:
        return False
    if workspace_id is None:
        return False
    owned = Bucket.objects.filter(name=name).filter(
        models.Q(workspace_id=workspace_id) | models.Q(granted_to__id=workspace_id)
    )
    return owned.exists()


def buckets_of(user) -> set[str]:
    """The names of the buckets owned by or granted to the workspaces of `user` (a superuser: of
    every workspace, so every registered bucket)."""
    from .access import workspaces_of
    from .models import Bucket

    workspaces = workspaces_of(user)
    rows = Bucket.objects.filter(models.Q(workspace__in=workspaces) | models.Q(granted_to__in=workspaces))
    return set(rows.values_list("name", flat=True))


def tenancy_error(url: str, workspace, label: str) -> str:
    """'' when `workspace` may use `url`'s bucket, else the refusal naming the field (`label`)."""
    if bucket_allowed(url, workspace):
        return ""
    try:
        name = bucket_of(url)
    except StorageError as exc:
        return gettext("%(label)s: %(message)s") % {"label": label, "message": exc}
    from .models import Workspace

    workspace_id = getattr(workspace, "pk", workspace)
    shown = Workspace.objects.filter(pk=workspace_id).values_list("name", flat=True).first() if workspace_id else None
    message = gettext("%(label)s: bucket '%(bucket)s' is not owned by or granted to workspace '%(workspace)s'.")
    return message % {"label": label, "bucket": name, "workspace": shown or "(none)"}


def bucket_exists(url: str) -> bool:
    try:
        return (root() / bucket_of(url)).is_dir()
    except StorageError:
        return False


def exists(url: str) -> bool:
    try:
        return local_path(url).exists()
    except StorageError:
        return False


@contextmanager
def _resolved_folder(url: str, path: Path) -> Iterator[tuple[int, str]]:
    """(descriptor, path from the bucket folder) of folder `path`, which local_path(url) resolved:
    opened from the bucket folder one part at a time without following links, so that a folder a
    job swapped for a link since local_path looked is refused (a StorageError naming it), never
    followed out of the bucket. What is missing, here or in the body, is NotInStorage."""
    bucket = bucket_of(url)
    base = _bucket_dir(bucket, url)
    relative = path.relative_to(base).as_posix()
    try:
        with hostpaths.open_dir(base, relative) as folder:
            yield folder, relative
    except hostpaths.PathEscape as exc:
        raise _escape(bucket, exc) from None
    except (FileNotFoundError, NotADirectoryError):
        raise NotInStorage(gettext("'%(url)s' does not exist in object storage.") % {"url": url}) from None


@dataclass(frozen=True)
class Usage:
    """What a folder holds. `complete` is False when the walk stopped early at `stop_after_*`
    (the numbers are then lower bounds, already over a limit)."""

    bytes: int
    files: int
    depth: int
    complete: bool = True
    folders: int = 0


# A walk of a folder a job can write stops after this many sub-folders whatever else it was asked:
# a million empty folders would hold the request (or a publish's transaction) for minutes.
MEASURE_MAX_FOLDERS = v.CODE_DIR_MAX_FILES


def measure(
    url: str,
    *,
    stop_after_files: int | None = None,
    stop_after_bytes: int | None = None,
    stop_after_folders: int = MEASURE_MAX_FOLDERS,
) -> Usage:
    """Total size, number of files and folders, and depth of the folder `url`.

    Depth counts path parts below the folder: a file directly in it has depth 1,
    `a/b/c.py` depth 3; an empty sub-folder counts as deep as its own path. Symbolic
    links are not followed (a link counts as one file of its own size), nor is a folder swapped
    for one while the walk goes (each is opened without following links, from its parent's
    descriptor). The walk stops once it is over `stop_after_files` files, `stop_after_bytes`
    bytes or `stop_after_folders` folders, so an enormous folder is refused without being read
    entirely.
    """
    counts = {"bytes": 0, "files": 0, "folders": 0, "depth": 0}

    def over() -> bool:
        return (
            (stop_after_files is not None and counts["files"] > stop_after_files)
            or (stop_after_bytes is not None and counts["bytes"] > stop_after_bytes)
            or counts["folders"] > stop_after_folders
        )

    def walk(folder: int, level: int, at: str) -> bool:
        """False once a limit was passed (the walk stops)."""
        with os.scandir(folder) as it:
            for entry in it:
                counts["depth"] = max(counts["depth"], level + 1)
                if entry.is_dir(follow_symlinks=False):
                    counts["folders"] += 1
                    if over() or level + 1 >= hostpaths.MAX_COPY_DEPTH:
                        return False
                    try:
                        child = hostpaths.open_child(folder, entry.name, at=f"{at}{entry.name}")
                    except FileNotFoundError:  # removed while we were walking (a running job's folder)
                        continue
                    try:
                        if not walk(child, level + 1, f"{at}{entry.name}/"):
                            return False
                    finally:
                        os.close(child)
                    continue
                try:
                    size = entry.stat(follow_symlinks=False).st_size
                except FileNotFoundError:  # removed while we were walking
                    continue
                counts["files"] += 1
                counts["bytes"] += size
                if over():
                    return False
        return True

    try:
        with _resolved_folder(url, local_path(url)) as (top, relative):
            complete = walk(top, 0, "" if relative == "." else f"{relative}/")  # named from the bucket
    except OSError as exc:
        raise StorageError(gettext("Cannot read '%(url)s': %(why)s.") % {"url": url, "why": exc.strerror}) from None
    return Usage(counts["bytes"], counts["files"], counts["depth"], complete, counts["folders"])


def code_dir_errors(url: str) -> list[str]:
    """SPEC §3 code dir at submission: <= CODE_DIR_MAX_BYTES, <= CODE_DIR_MAX_FILES files,
    depth <= CODE_DIR_MAX_DEPTH. Messages name the field and the limit."""
    try:
        usage = measure(url, stop_after_files=v.CODE_DIR_MAX_FILES, stop_after_bytes=v.CODE_DIR_MAX_BYTES)
    except StorageError as exc:
        return [gettext("Code dir: %(message)s") % {"message": exc}]
    errors = []
    # A walk that stopped early counted a lower bound: "N or more".
    more = "" if usage.complete else gettext(" or more")
    if usage.bytes > v.CODE_DIR_MAX_BYTES:
        message = gettext("Code dir must hold at most %(max)s in total; '%(url)s' holds %(size)s%(more)s.")
        errors.append(
            message
            % {"max": human_bytes(v.CODE_DIR_MAX_BYTES), "url": url, "size": human_bytes(usage.bytes), "more": more}
        )
    if usage.files > v.CODE_DIR_MAX_FILES:
        message = gettext("Code dir must hold at most %(max)s files; '%(url)s' holds %(files)s%(more)s.")
        errors.append(message % {"max": v.CODE_DIR_MAX_FILES, "url": url, "files": usage.files, "more": more})
    if usage.depth > v.CODE_DIR_MAX_DEPTH:
        message = gettext("Code dir must be at most %(max)s levels deep; '%(url)s' is %(depth)s%(more)s.")
        errors.append(message % {"max": v.CODE_DIR_MAX_DEPTH, "url": url, "depth": usage.depth, "more": more})
    if usage.folders > MEASURE_MAX_FOLDERS:
        message = gettext("Code dir must hold at most %(max)s folders; '%(url)s' holds %(folders)s%(more)s.")
        errors.append(message % {"max": MEASURE_MAX_FOLDERS, "url": url, "folders": usage.folders, "more": more})
    return errors


def human_bytes(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" or n == int(n) else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} GB"  # pragma: no cover


# -- the code dir browser ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Entry:
    name: str
    url: str
    is_dir: bool
    size: int
    editable: bool
    viewable: bool
    modified: float  # st_mtime, from the listing's own stat


def can_edit(url: str) -> bool:
    return PurePosixPath(url).suffix.lower() in EDITABLE_SUFFIXES


def can_view(url: str) -> bool:
    return can_edit(url) or PurePosixPath(url).suffix.lower() in VIEWABLE_SUFFIXES


def listdir(url: str, most: int | None = None) -> list[Entry]:
    """The folders then files directly in folder `url` (ending in '/'), listed through the resolved
    folder opened without following links (as read_stored): a folder swapped for a link since
    local_path looked is refused, not listed. `most`: at most that many entries are read (in the
    folder's own order, then sorted), so a folder of millions costs no more than that."""
    prefix = url if url.endswith("/") else url + "/"
    out = []
    # The entries are read while the folder is open: they are looked at relative to it.
    with _resolved_folder(url, local_path(url)) as (folder, _), os.scandir(folder) as it:
        for entry in itertools.islice(it, most):
            is_dir = entry.is_dir(follow_symlinks=False)
            child = prefix + entry.name + ("/" if is_dir else "")
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:  # removed while we were listing
                continue
            size = 0 if is_dir else st.st_size
            editable, viewable = not is_dir and can_edit(child), not is_dir and can_view(child)
            out.append(Entry(entry.name, child, is_dir, size, editable, viewable, st.st_mtime))
    return sorted(out, key=lambda e: (not e.is_dir, e.name))


@dataclass(frozen=True)
class StoredFile:
    """A file of object storage as the browser shows it: its size and time from the opened file,
    and its bytes, or None when it is larger than MAX_TEXT_BYTES (then it was not read)."""

    size: int
    modified: float
    data: bytes | None


def read_stored(url: str) -> StoredFile:
    """The file `url`, read through its resolved folder opened without following links: a folder or
    the file itself swapped for a link since local_path looked is refused, not followed out of the
    bucket; anything but a regular file is refused without waiting on it (a job's FIFO). At most
    MAX_TEXT_BYTES are read, also of a file that grew past them since its size was taken."""
    path = local_path(url)
    if path == _bucket_dir(bucket_of(url), url):
        raise StorageError(f"'{url}' is a folder.")
    with _resolved_folder(url, path.parent) as (folder, relative):
        try:
            f = hostpaths.open_regular(folder, path.name)
        except hostpaths.PathEscape:  # the file itself is a link: named from the bucket, as a folder is
            raise hostpaths.PathEscape(path.name if relative == "." else f"{relative}/{path.name}") from None
        with f:
            st = os.fstat(f.fileno())
            data = f.read(MAX_TEXT_BYTES + 1) if st.st_size <= MAX_TEXT_BYTES else b""
    size = max(st.st_size, len(data))
    return StoredFile(size, st.st_mtime, data if size <= MAX_TEXT_BYTES else None)


def read_text(url: str) -> str:
    if not can_view(url):
        suffixes = ", ".join(EDITABLE_SUFFIXES + VIEWABLE_SUFFIXES)
        raise StorageError(gettext("Only %(suffixes)s files can be viewed.") % {"suffixes": suffixes})
    try:
        stored = read_stored(url)
    except OSError as exc:  # not a regular file
        raise StorageError(f"'{url}' cannot be read: {exc.strerror}.") from None
    if stored.data is None:
        raise StorageError(f"'{url}' is larger than {human_bytes(MAX_TEXT_BYTES)}: download it instead.")
    return stored.data.decode("utf-8", errors="replace")


def write_text(url: str, text: str) -> None:
    if not can_edit(url):
        raise StorageError(
            gettext("Only %(suffixes)s files can be edited.") % {"suffixes": ", ".join(EDITABLE_SUFFIXES)}
        )
    data = text.encode("utf-8")
    if len(data) > MAX_TEXT_BYTES:
        raise StorageError(
            gettext("At most %(max)s can be saved from the editor.") % {"max": human_bytes(MAX_TEXT_BYTES)}
        )
    path = local_path(url)
    if not path.parent.is_dir():
        raise StorageError(gettext("The folder of '%(url)s' does not exist in object storage.") % {"url": url})
    if path.is_dir():
        raise StorageError(f"'{url}' is a folder.")
    # local_path resolved the links (and refused those out of the bucket); the write itself goes
    # through the resolved folder opened without following links, so that a folder swapped for a
    # link meanwhile is refused, not followed.
    with _resolved_folder(url, path.parent) as (folder, _):
        try:
            st = os.stat(path.name, dir_fd=folder, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                raise StorageError(f"'{url}' is a folder.")
            # Keep the file's mode: saving run.sh from the editor must not drop its execute bit.
            # The file's permissions, without setuid/setgid/sticky bits a job may have set.
            mode = (st.st_mode & 0o777) if stat.S_ISREG(st.st_mode) else 0o666 & ~_umask()
            owner = console_owner(st)  # a save keeps the file's owner: the job that wrote it still may
        except FileNotFoundError:
            mode = 0o666 & ~_umask()  # a new file: what a plain open() would have made
            owner = console_owner()
        # A unique temporary name and a rename: two saves of one file at once never mix.
        hostpaths.write_file(folder, path.name, data, mode=mode, owner=owner)


def _umask() -> int:
    """The process umask, read without os.umask(): setting it, even briefly, races with other threads."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    return 0o022
