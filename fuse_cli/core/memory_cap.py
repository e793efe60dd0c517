"""The run's memory cap (`--max-memory`): a watchdog on the process's anonymous resident memory.

Not RLIMIT_AS: onnxruntime and glibc reserve address space they never touch (thread stacks,
malloc arenas: 600 MB of address space for 110 MB resident in a small run here, and arenas grow
with the core count), and weights are mapped from their files; a cap on address space would stop
honest runs on big machines and models, and a failed allocation inside onnxruntime surfaces as
whatever that library makes of it. RssAnon counts what the run really holds in RAM.

Crossing the cap raises MemoryCapExceeded in the main thread (a FuseError: exit 2, one line, the
`finally` blocks that remove scratch files run). The main thread only sees it between Python
bytecodes; when it stays inside one native call (an onnxruntime run allocating), the process ends
with exit 2 and the same line after GRACE_S, or at once past 1.5x the cap.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

from fuse_cli.errors import FuseError

DEFAULT_FRACTION = 0.75
POLL_S = 0.02
GRACE_S = 2.0


class MemoryCapExceeded(FuseError):
    """The run held more memory than --max-memory allows."""


def total_ram_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def default_cap_bytes() -> int:
    return int(total_ram_bytes() * DEFAULT_FRACTION)


def anonymous_rss_bytes(pid: int | str = "self") -> int | None:
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            for line in status:
                if line.startswith(b"RssAnon:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _held_by_run() -> int:
    """This process's anonymous memory and its onnxruntime workers' (core/isolation.py), where
    verification builds the model's activations: the cap is the run's, not one process's."""
    from fuse_cli.core import isolation

    return (anonymous_rss_bytes() or 0) + sum(anonymous_rss_bytes(pid) or 0 for pid in isolation.worker_pids())


_started: list[threading.Thread] = []


def watch_memory(cap_bytes: int | None) -> None:
    """Enforce `cap_bytes` (None: 75% of RAM) for the rest of this process; once per process."""
    if _started or anonymous_rss_bytes() is None or threading.current_thread() is not threading.main_thread():
        return  # no /proc (not Linux): no cap; a second call keeps the first cap
    cap = cap_bytes if cap_bytes is not None else default_cap_bytes()
    message = f"memory use reached --max-memory ({cap / 2**20:.0f} MB); the model needs more, or raise the cap"

    def on_signal(signum, frame):
        raise MemoryCapExceeded(message)

    signal.signal(signal.SIGUSR1, on_signal)
    thread = threading.Thread(target=_watch, args=(cap, message), name="fuse-memory-cap", daemon=True)
    _started.append(thread)
    thread.start()


def _watch(cap: int, message: str) -> None:
    crossed_at = None
    while True:
        time.sleep(POLL_S)
        held = _held_by_run()
        if held <= cap:
            crossed_at = None
            continue
        if crossed_at is None:
            crossed_at = time.monotonic()
            signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)
        elif held > cap * 1.5 or time.monotonic() - crossed_at > GRACE_S:
            from fuse_cli.core import isolation

            for worker in isolation.worker_pids():  # it would run on, holding its memory, until its call returns
                os.kill(worker, signal.SIGKILL)
            sys.stderr.write(f"fuse: error: {message}\n")
            sys.stderr.flush()
            os._exit(2)
