"""Put on the Celery worker's PYTHONPATH by bench/worker_soak.py only: counts the worker's Python
heap on request. Not part of the console.

The benchmark writes `<BENCH_HEAP_DIR>/ask-<n>`; a thread of the worker answers with
`<BENCH_HEAP_DIR>/heap-<n>`, after a full collection: the blocks Python's allocator holds (sys.getallocatedblocks), the
objects the garbage collector tracks, and those objects counted by type (the most common 200);
and, from glibc (mallinfo2, every arena), the bytes malloc has handed out and not had back
("malloc_in_use") and those it holds free ("malloc_free"): RSS that grows while the first stays
is memory the allocator keeps, not memory the process holds. With BENCH_HEAP_TRACE=1 it also
traces Python's allocations from the first look on and adds, to each later answer, the 15 lines
of code whose memory grew most since (lines starting "# "). With BENCH_HEAP_NATIVE=<file> (and
memray installed) it records every allocation, C libraries' included, with its native stack,
from the second look to the fourth: `memray transform csv --leaks <file>` then lists what was
allocated between those looks and is still held at the fourth, what a leak per run would be.
"""

import os
import sys
import threading
import time

HEAP_DIR = os.environ.get("BENCH_HEAP_DIR")


def _malloc() -> tuple[int, int]:
    """(in use, held free) bytes of glibc's malloc, every arena; (-1, -1) without mallinfo2."""
    import ctypes

    class MallInfo2(ctypes.Structure):
        _fields_ = [
            (name, ctypes.c_size_t)
            for name in (
                "arena",
                "ordblks",
                "smblks",
                "hblks",
                "hblkhd",
                "usmblks",
                "fsmblks",
                "uordblks",
                "fordblks",
                "keepcost",
            )
        ]

    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = MallInfo2
    except (OSError, AttributeError):
        return -1, -1
    info = libc.mallinfo2()
    return info.uordblks + info.hblkhd, info.fordblks


def _answer_forever(folder: str) -> None:
    import collections
    import gc
    import tracemalloc

    trace = os.environ.get("BENCH_HEAP_TRACE") == "1"
    native = os.environ.get("BENCH_HEAP_NATIVE")
    tracker = None
    first = None
    answered = set()
    while True:
        for name in sorted(os.listdir(folder)):
            if not name.startswith("ask-") or name in answered:
                continue
            answered.add(name)
            gc.collect()  # what is garbage already is not held
            counts = collections.Counter(
                f"{getattr(type(o), '__module__', '?')}.{type(o).__qualname__}" for o in gc.get_objects()
            )
            in_use, held_free = _malloc()
            lines = [f"blocks {sys.getallocatedblocks()}", f"objects {sum(counts.values())}"]
            lines += [f"malloc_in_use {in_use}", f"malloc_free {held_free}"]
            lines += [f"{n} {kind}" for kind, n in counts.most_common(200)]
            if trace and first is None:  # from the first look on: every allocation through Python's
                tracemalloc.start(1)
                first = tracemalloc.take_snapshot()
            elif trace:
                grown = tracemalloc.take_snapshot().compare_to(first, "lineno")[:15]
                lines += [f"# {stat}" for stat in grown]
            if native and len(answered) == 2:
                import memray

                tracker = memray.Tracker(native, native_traces=True)
                tracker.__enter__()
            elif tracker is not None and len(answered) == 4:
                tracker.__exit__(None, None, None)
                tracker = None
            answer = os.path.join(folder, "heap-" + name[len("ask-") :])
            with open(answer + ".tmp", "w") as f:
                f.write("\n".join(lines) + "\n")
            os.replace(answer + ".tmp", answer)
        time.sleep(0.2)


if HEAP_DIR and any(arg.endswith("celery") for arg in sys.argv[:1]):
    threading.Thread(target=_answer_forever, args=(HEAP_DIR,), daemon=True, name="bench-heap").start()
