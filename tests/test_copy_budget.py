"""What a job can write, the console copies and measures with limits it cannot outgrow
(jobs/runtime/hostpaths.py CopyBudget, jobs/storage.py measure): a code dir's bucket may be mounted
read-write into a running job, which may grow it, fill it with folders or links, or swap a folder
for a link while the console walks it. Plain folders, no Docker."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from jobs import storage
from jobs.runtime import hostpaths

GB = 1024**3


@contextmanager
def opened(source: Path, target: Path) -> Iterator[tuple[int, int]]:
    source.mkdir(exist_ok=True)
    target.mkdir(exist_ok=True)
    src_fd, dst_fd = os.open(source, os.O_RDONLY | os.O_DIRECTORY), os.open(target, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield src_fd, dst_fd
    finally:
        os.close(src_fd)
        os.close(dst_fd)


def code_budget() -> hostpaths.CopyBudget:
    return hostpaths.CopyBudget(1000, 5 * GB, "the code dir")


def test_a_copy_stops_when_its_source_grew_past_the_limits(tmp_path):
    """A code dir whose bucket a job can write may grow after submission: the copy counts
    files and bytes (a sparse file by its apparent size) and stops at the limits."""
    source, target = tmp_path / "src", tmp_path / "dst"
    source.mkdir()
    (source / "small.py").write_text("print(1)\n")
    with open(source / "sparse.bin", "wb") as f:
        f.truncate(10 * GB)  # 10 GB apparent, nothing on disk
    with opened(source, target) as (src_fd, dst_fd):
        with pytest.raises(OSError, match="grew past its limits"):
            hostpaths.copytree_into(src_fd, dst_fd, budget=code_budget())
    assert not (target / "sparse.bin").exists()


def test_a_file_grown_while_it_is_copied_is_copied_as_it_was_opened(tmp_path, monkeypatch):
    """The job's `truncate -s 100T f` loop, made to land every time: right after the copy opened the
    file (its size charged: 10 bytes), the file grows. The copy takes the 10 bytes it was charged,
    never the new end (64 MiB here; 100 TB of zeros from a job)."""
    source, target = tmp_path / "src", tmp_path / "dst"
    source.mkdir()
    (source / "f.py").write_bytes(b"0123456789")
    real = hostpaths.create_file

    def grown_then_created(dir_fd: int, name: str, mode: int) -> int:
        os.truncate(source / name, 64 * 1024**2)
        return real(dir_fd, name, mode)

    monkeypatch.setattr(hostpaths, "create_file", grown_then_created)
    budget = code_budget()
    with opened(source, target) as (src_fd, dst_fd):
        hostpaths.copytree_into(src_fd, dst_fd, budget=budget)
    assert (target / "f.py").read_bytes() == b"0123456789"
    assert (budget.files, budget.bytes) == (999, 5 * GB - 10)


def test_links_and_folders_count_against_a_copys_budget(tmp_path):
    """A link is a file of the budget (as measure counts it), a folder one of its folders: a million
    empty folders or links would otherwise pass every limit and be made again at each start."""
    links, folders = tmp_path / "links", tmp_path / "folders"
    links.mkdir()
    for i in range(4):
        (links / f"l{i}").symlink_to("/etc/passwd")
    with opened(links, tmp_path / "copy1") as (src_fd, dst_fd):
        with pytest.raises(OSError, match="grew past its limits"):
            hostpaths.copytree_into(src_fd, dst_fd, budget=hostpaths.CopyBudget(3, GB, "the code dir"))
    folders.mkdir()
    for i in range(4):
        (folders / f"d{i}").mkdir()
    with opened(folders, tmp_path / "copy2") as (src_fd, dst_fd):
        with pytest.raises(OSError, match="more folders than it may"):
            hostpaths.copytree_into(src_fd, dst_fd, budget=hostpaths.CopyBudget(3, GB, "the code dir"))
    with opened(folders, tmp_path / "copy3") as (src_fd, dst_fd):
        hostpaths.copytree_into(src_fd, dst_fd, budget=hostpaths.CopyBudget(3, GB, "the code dir", folders=4))
    assert sorted(os.listdir(tmp_path / "copy3")) == ["d0", "d1", "d2", "d3"]


def test_a_folder_of_more_entries_than_the_budget_takes_is_refused_without_listing_it_all(tmp_path):
    """Entries the copy leaves out (FIFOs, sockets) are listed too: a folder of more names than the
    budget's files and folders together is refused after reading one more than that."""
    source = tmp_path / "src"
    source.mkdir()
    for i in range(8):
        os.mkfifo(source / f"p{i}")
    with opened(source, tmp_path / "dst") as (src_fd, dst_fd):
        with pytest.raises(OSError, match="holds more entries than it may"):
            hostpaths.copytree_into(src_fd, dst_fd, budget=hostpaths.CopyBudget(3, GB, "the code dir"))


@pytest.fixture
def obs(settings, tmp_path) -> Path:
    top = tmp_path / "object-storage"
    (top / "b01" / "code").mkdir(parents=True)
    (top / "b02" / "code").mkdir(parents=True)
    settings.OBJECT_STORAGE_ROOT = str(top)
    return top


def test_measure_stops_after_its_folders_and_a_code_dir_of_empty_folders_is_refused(obs):
    code = obs / "b01/code"
    (code / "train.py").write_text("x\n")
    for i in range(storage.MEASURE_MAX_FOLDERS + 5):
        (code / f"d{i}").mkdir()
    usage = storage.measure("obs://b01/code/", stop_after_files=1000)
    assert (usage.complete, usage.folders) == (False, storage.MEASURE_MAX_FOLDERS + 1)
    errors = storage.code_dir_errors("obs://b01/code/")
    assert errors == ["Code dir must hold at most 1000 folders; 'obs://b01/code/' holds 1001 or more."]


def test_measure_never_follows_a_folder_swapped_for_a_link_during_the_walk(obs, monkeypatch):
    """Between the listing that saw a folder and its opening, the job swaps it for a link to another
    bucket: the walk refuses it (it is opened without following links), and counts nothing there."""
    code = obs / "b01/code"
    (code / "sub").mkdir()
    for i in range(3):
        (obs / f"b02/code/other{i}.py").write_text("x\n")
    real = hostpaths.open_child

    def swapped_then_opened(dir_fd: int, name: str, *, at: str = "") -> int:
        if name == "sub" and not (code / "sub").is_symlink():
            (code / "sub").rmdir()
            (code / "sub").symlink_to(obs / "b02/code")
        return real(dir_fd, name, at=at)

    monkeypatch.setattr(hostpaths, "open_child", swapped_then_opened)
    with pytest.raises(storage.StorageError, match="'obs://b01/code/sub/' is a symbolic link"):
        storage.measure("obs://b01/code/")
