"""Host paths a job cannot redirect (SPEC §8: "a symlink or `..` planted by any job leads
nowhere outside that job's own folders").

The console (root) works in folders that jobs write too: object storage buckets (mounted
read-write, artifact folders), host-directory file systems, the local code copies. A job can
plant a symbolic link there (`ln -s /etc <backup dir>/<job>-worker-0`), or swap a folder for a
link while the console works in it. Every host operation the console does for a job therefore
goes through here:

- a path is a trusted root (an operator's setting: JOB_DATA_ROOT, a bucket folder, a file
  system's source; links *in the root itself* are the operator's and are followed) and a
  relative part, walked one component at a time with openat(O_NOFOLLOW | O_DIRECTORY):
  a component that is a symbolic link raises PathEscape, '..' raises PathEscape, nothing is
  ever resolved by the kernel from a path string the job could have changed;
- the work is done relative to the opened folder's descriptor (dir_fd): creating, writing,
  renaming, copying and removing never follow a link, and a folder swapped for a link after it
  was checked is refused when it is opened, not followed;
- a bind mount source (a path string Docker resolves itself) is checked the same way just
  before the container is made: `confined()`.

What stays: between `confined()` and the container's start, a job writing in the parent of a
mounted folder could still swap it for a link (Docker resolves the source itself); see
docs/decisions.md.
"""

from __future__ import annotations

import errno
import itertools
import os
import shutil
import stat
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_COPY_DEPTH = 128  # a copied tree deeper than this is refused (each level holds two descriptors)
COPY_CHUNK = 1024 * 1024


class PathEscape(OSError):
    """A path a job could have redirected: a component is a symbolic link, or is '..'.

    `at` is the relative part up to the offending component and `reason` what is wrong with it,
    so that callers can name it the way the user knows it (obs://bucket/<at>, a file system's
    <name>:/<at>); str() names it relative to the root."""

    def __init__(self, at: str, reason: str = "is a symbolic link"):
        self.at, self.reason = at, reason
        super().__init__(errno.ELOOP, f"'{at}' {reason}")

    def __str__(self) -> str:
        return f"'{self.at}' {self.reason}"


def parts(relative: str | os.PathLike = "") -> list[str]:
    """The components of a relative path ('/'-separated; a leading '/' is ignored, '' and '.'
    are skipped). '..' is refused: it could lead out of the root."""
    out = []
    for part in os.fspath(relative).split("/"):
        if part in ("", "."):
            continue
        if part == ".." or "\x00" in part:
            raise PathEscape("/".join([*out, part]), "is not allowed ('..' or NUL): it could lead out of the folder")
        out.append(part)
    return out


def _is_link(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except FileNotFoundError:
        return False


def open_child(dir_fd: int, name: str, *, at: str = "") -> int:
    """The descriptor of folder `name` in `dir_fd`; a link there is refused (PathEscape)."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ENOTDIR, errno.ELOOP) and _is_link(dir_fd, name):
            raise PathEscape(at or name) from None
        raise


def _open_or_make(dir_fd: int, name: str, mode: int, *, at: str) -> tuple[int, bool]:
    for _ in range(3):
        try:
            return open_child(dir_fd, name, at=at), False
        except FileNotFoundError:
            pass
        try:
            # mkdir never follows a link at its last component: a link planted there makes EEXIST.
            os.mkdir(name, mode, dir_fd=dir_fd)
        except FileExistsError:
            continue  # made concurrently (or a link): open it again, which refuses a link
        return open_child(dir_fd, name, at=at), True
    return open_child(dir_fd, name, at=at), False


def _walk(root: str | os.PathLike, relative, *, create: bool, mode: int, missing_ok: bool = False):
    """(descriptor of root/relative or None when missing and missing_ok, whether the leaf was made)."""
    names = parts(relative)
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # trusted: links in the root are followed
    except FileNotFoundError:
        if missing_ok:
            return None, False
        raise
    made = False
    try:
        for i, name in enumerate(names):
            at = "/".join(names[: i + 1])
            try:
                if create:
                    child, made = _open_or_make(fd, name, mode, at=at)
                else:
                    child = open_child(fd, name, at=at)
            except FileNotFoundError:
                if missing_ok:
                    os.close(fd)
                    return None, False
                raise FileNotFoundError(errno.ENOENT, "No such file or directory", os.path.join(root, at)) from None
            except NotADirectoryError:
                raise NotADirectoryError(errno.ENOTDIR, "Not a directory", os.path.join(root, at)) from None
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd, made


@contextmanager
def open_dir(
    root: str | os.PathLike,
    relative: str | os.PathLike = "",
    *,
    create: bool = False,
    mode: int = 0o777,
    owner: tuple[int, int] | None = None,
) -> Iterator[int]:
    """The descriptor of folder root/relative, every component below root opened without
    following links. `create`: missing folders are made (with `mode`, less the umask); the
    last one, when this call made it, is given to `owner` (uid, gid)."""
    fd, made = _walk(root, relative, create=create, mode=mode)
    try:
        if made and owner is not None:
            give(fd, owner)
        yield fd
    finally:
        os.close(fd)


def confined(root: str | os.PathLike, relative: str | os.PathLike = "") -> Path:
    """root/relative, checked: no component below root is a link or '..', each existing one is a
    folder. A missing tail is allowed (nothing there to follow). For a path the console hands on
    as a string (a bind mount source): the walk is as of now."""
    fd, _ = _walk(root, relative, create=False, mode=0, missing_ok=True)
    path = Path(root).joinpath(*parts(relative))
    if fd is not None:
        try:
            expected = os.path.join(os.path.realpath(root), *parts(relative))
            try:
                actual = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                actual = expected  # no /proc: the walk alone decides
            if actual != expected:
                raise PathEscape("/".join(parts(relative)), "moved while it was checked")
        finally:
            os.close(fd)
    return path


def makedirs_confined(
    root: str | os.PathLike, relative: str | os.PathLike, *, mode: int = 0o777, owner: tuple[int, int] | None = None
) -> Path:
    """Make root/relative (missing folders only, never through a link); the last folder, when
    made here, is given to `owner`."""
    with open_dir(root, relative, create=True, mode=mode, owner=owner):
        pass
    return Path(root).joinpath(*parts(relative))


def give(fd: int, owner: tuple[int, int]) -> None:
    """fchown to owner; a console that may not chown (not root) opens the folder or file to
    everyone instead, so that the job's user can write it."""
    try:
        os.fchown(fd, *owner)
    except PermissionError:
        mode = os.fstat(fd).st_mode
        os.fchmod(fd, stat.S_IMODE(mode) | (0o777 if stat.S_ISDIR(mode) else 0o666))


def _give_link(dir_fd: int, name: str, owner: tuple[int, int]) -> None:
    try:
        os.chown(name, *owner, dir_fd=dir_fd, follow_symlinks=False)
    except PermissionError:
        pass  # a link's own mode means nothing


def is_dir_at(dir_fd: int, name: str) -> bool:
    """Whether `name` in `dir_fd` is a folder (a link is not: it raises PathEscape)."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(st.st_mode):
        raise PathEscape(name)
    return stat.S_ISDIR(st.st_mode)


class TooLarge(OSError):
    """A file read with read_file(max_bytes=...) holds more than that."""


def open_regular(dir_fd: int, name: str) -> BinaryIO:
    """Regular file `name` in `dir_fd`, open for reading: a link is refused (PathEscape), and so is
    anything else that is not a regular file, without waiting on it (O_NONBLOCK: a FIFO a job made
    would block the reader until someone writes to it)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise PathEscape(name) from None
        raise
    f = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        f.close()
        raise OSError(errno.EINVAL, f"'{name}' is not a regular file")
    return f


def read_file(dir_fd: int, name: str, *, max_bytes: int | None = None) -> bytes:
    """The bytes of regular file `name` in `dir_fd` (open_regular); a file over `max_bytes` is
    refused (TooLarge)."""
    with open_regular(dir_fd, name) as f:
        data = f.read() if max_bytes is None else f.read(max_bytes + 1)
    if max_bytes is not None and len(data) > max_bytes:
        raise TooLarge(errno.EFBIG, f"'{name}' is larger than {max_bytes} bytes")
    return data


def create_file(dir_fd: int, name: str, mode: int) -> int:
    """A new file `name` in `dir_fd` (O_EXCL | O_NOFOLLOW: never an existing file or a link), with `mode`."""
    return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)


def write_file(
    dir_fd: int,
    name: str,
    data: bytes | Iterable[bytes | str],
    *,
    mode: int = 0o644,
    owner: tuple[int, int] | None = None,
) -> None:
    """Write `name` in `dir_fd` whole or not at all: into a new file beside it, then renamed over
    it (a link at `name` is replaced, never followed). str chunks are written as UTF-8."""
    tmp = f".{name[:64]}.{uuid.uuid4().hex[:8]}.tmp"
    fd = create_file(dir_fd, tmp, mode)
    try:
        with os.fdopen(fd, "wb") as out:
            for chunk in [data] if isinstance(data, bytes | bytearray) else data:
                out.write(chunk.encode("utf-8", "surrogateescape") if isinstance(chunk, str) else chunk)
            out.flush()
            os.fchmod(out.fileno(), mode)  # exactly `mode`, whatever the umask
            if owner is not None:
                os.fchown(out.fileno(), *owner)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        _unlink_quietly(dir_fd, tmp)
        raise


def _unlink_quietly(dir_fd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass


def make_temp_dir(dir_fd: int, prefix: str, mode: int = 0o700) -> str:
    """A new folder in `dir_fd` with a unique name starting with `prefix`; returns its name."""
    while True:
        name = f"{prefix}{uuid.uuid4().hex[:8]}"
        try:
            os.mkdir(name, mode, dir_fd=dir_fd)
            return name
        except FileExistsError:
            continue


def remove_at(dir_fd: int, name: str) -> None:
    """Remove entry `name` of `dir_fd`, whatever it is: a link or a file is unlinked (the link
    itself, never what it names), a folder removed with everything in it without following any
    link (shutil.rmtree with dir_fd). Missing: nothing to do."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(name, dir_fd=dir_fd)
    else:
        try:
            os.unlink(name, dir_fd=dir_fd)
        except FileNotFoundError:
            pass


def rmtree_confined(root: str | os.PathLike, relative: str | os.PathLike) -> None:
    """Remove root/relative (the path to it walked without following links; the tree itself
    removed without following any). A missing path is no error; a link on the way is."""
    names = parts(relative)
    if not names:
        raise ValueError("rmtree_confined: refusing to remove the root itself")
    parent, _ = _walk(root, "/".join(names[:-1]), create=False, mode=0, missing_ok=True)
    if parent is None:
        return
    try:
        remove_at(parent, names[-1])
    finally:
        os.close(parent)


def replace_dir(dir_fd: int, new: str, name: str) -> None:
    """Put folder `new` of `dir_fd` in place of `name` (whatever `name` is now: a folder, a
    link, a file, nothing); the old one is moved aside first, then removed. Names only: no link
    is followed."""
    aside = f".{name[:64]}.old.{uuid.uuid4().hex[:8]}"
    try:
        os.rename(name, aside, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except FileNotFoundError:
        aside = ""
    os.rename(new, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    if aside:
        remove_at(dir_fd, aside)


@dataclass
class CopyBudget:
    """What a copy may still take: a job that can write its source (a bucket mounted
    read-write) could grow it far past what was measured at submission. Links count as files
    (as storage.measure counts them), folders against `folders` (as many as files, unless said)."""

    files: int
    bytes: int
    what: str = "the folder"
    folders: int | None = None

    def __post_init__(self) -> None:
        if self.folders is None:
            self.folders = self.files

    def take(self, size: int, at: str) -> None:
        self.files -= 1
        self.bytes -= size
        if self.files < 0 or self.bytes < 0:
            raise OSError(errno.EFBIG, f"{self.what} grew past its limits while copying (at {at})")

    def take_folder(self, at: str) -> None:
        self.folders -= 1
        if self.folders < 0:
            raise OSError(errno.EFBIG, f"{self.what} holds more folders than it may while copying (at {at})")


def copytree_into(
    src_fd: int,
    dst_fd: int,
    *,
    owner: tuple[int, int] | None = None,
    budget: CopyBudget | None = None,
    _at: str = "",
) -> None:
    """Copy the content of folder `src_fd` into (empty) folder `dst_fd`.

    Nothing is followed on either side: a link is copied as a link (its text, never what it
    names), a sub-folder is opened with O_NOFOLLOW (one swapped for a link while copying is
    refused), a file is opened with O_NOFOLLOW and copied only if it is a regular file;
    anything else (fifos, sockets, devices) is left out. New entries are made with O_EXCL /
    mkdir in `dst_fd`, so a name cannot lead the copy elsewhere. Modes and times are kept;
    with `owner` everything copied is given to it.
    """
    if _at.count("/") >= MAX_COPY_DEPTH:
        raise OSError(errno.ELOOP, f"the folder is more than {MAX_COPY_DEPTH} levels deep")
    # At most one name more than the budget can take: a folder of millions of entries (a job can
    # write its code dir's bucket) is refused after reading that many, not after listing them all.
    most = None if budget is None else max(budget.files, 0) + max(budget.folders, 0) + 1
    with os.scandir(src_fd) as it:
        names = [entry.name for entry in itertools.islice(it, most)]
    if most is not None and len(names) >= most:
        raise OSError(errno.EFBIG, f"{budget.what} holds more entries than it may (at {_at or './'})")
    for name in names:
        try:
            st = os.stat(name, dir_fd=src_fd, follow_symlinks=False)
        except FileNotFoundError:
            continue  # removed while copying
        if stat.S_ISLNK(st.st_mode):
            if budget is not None:
                budget.take(0, f"{_at}{name}")
            os.symlink(os.readlink(name, dir_fd=src_fd), name, dir_fd=dst_fd)
            if owner is not None:
                _give_link(dst_fd, name, owner)
        elif stat.S_ISDIR(st.st_mode):
            if budget is not None:
                budget.take_folder(f"{_at}{name}")
            child = open_child(src_fd, name, at=f"{_at}{name}")
            try:
                os.mkdir(name, 0o700, dir_fd=dst_fd)
                target = open_child(dst_fd, name)
                try:
                    copytree_into(child, target, owner=owner, budget=budget, _at=f"{_at}{name}/")
                    _finish(target, st, owner)
                finally:
                    os.close(target)
            finally:
                os.close(child)
        elif stat.S_ISREG(st.st_mode):
            _copy_file(src_fd, dst_fd, name, owner, at=f"{_at}{name}", budget=budget)


def _copy_file(
    src_fd: int, dst_fd: int, name: str, owner: tuple[int, int] | None, *, at: str, budget: CopyBudget | None
) -> None:
    """The file's bytes up to the size it had when opened, charged to `budget` (the apparent size:
    a sparse file counts whole): a file the job grows while it is copied (`truncate -s 100T`) is
    copied as it was, never read on to its new end."""
    try:
        source = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=src_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise PathEscape(at, "became a symbolic link while it was copied") from None
        raise
    try:
        st = os.fstat(source)
        if not stat.S_ISREG(st.st_mode):
            return  # swapped for something that is not a file: left out
        if budget is not None:
            budget.take(st.st_size, at)
        target = create_file(dst_fd, name, 0o600)
        try:
            left = st.st_size
            while left > 0:
                chunk = os.read(source, min(COPY_CHUNK, left))
                if not chunk:  # shrunk meanwhile
                    break
                left -= len(chunk)
                view = memoryview(chunk)
                while view:
                    view = view[os.write(target, view) :]
            _finish(target, st, owner)
        finally:
            os.close(target)
    finally:
        os.close(source)


def _finish(fd: int, st: os.stat_result, owner: tuple[int, int] | None) -> None:
    # The permission bits only: a setuid/setgid bit planted by a job is never copied (the copy may be root's).
    os.fchmod(fd, stat.S_IMODE(st.st_mode) & 0o777)
    if owner is not None:
        give(fd, owner)
    os.utime(fd, ns=(st.st_atime_ns, st.st_mtime_ns))
