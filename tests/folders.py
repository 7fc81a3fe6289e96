"""The folders a test job mounts or must not touch: a bucket of the object storage, a host
directory registered as a file system, and a snapshot of a tree to compare before and after."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from urllib.parse import urlencode

from tests.pytest_env import TMP


def bucket(name: str) -> Path:
    """A bucket in the object storage the worker uses (the same root as this process)."""
    from jobs import storage

    path = storage.root() / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def host_dir(name: str) -> tuple:
    """A host directory of this session registered as a file system every workspace may mount:
    (the FileSystem, its folder)."""
    from jobs.models import FileSystem, Workspace

    folder = Path(TMP) / f"fs-{name}"
    folder.mkdir(parents=True, exist_ok=True)
    fs = FileSystem.objects.create(name=name, kind=FileSystem.Kind.HOST_DIR, source=str(folder))
    fs.workspaces.add(*Workspace.objects.all())  # the test's workspaces may mount it
    return fs, folder


def snapshot(folder: Path) -> dict[str, tuple]:
    """Every entry below `folder` (not following links) with its type, mode, owner and content."""
    out = {}
    for top, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = Path(top, name)
            st = path.lstat()
            content = path.read_bytes() if stat.S_ISREG(st.st_mode) else os.readlink(path) if path.is_symlink() else b""
            out[str(path.relative_to(folder))] = (stat.S_IFMT(st.st_mode), st.st_mode & 0o7777, st.st_uid, content)
    return out


BROWSE = "/storage/"  # the code dir browser (jobs/views/storage_browser.py)


def browse(path: str = "", **params: str) -> str:
    """The code dir browser's URL for an obs:// path, with these query parameters."""
    query = {"path": path} if path else {}
    return BROWSE + ("?" + urlencode(query | params) if query or params else "")
