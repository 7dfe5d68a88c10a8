"""A few daemon threads that run jobs from a bounded queue: the eager kernels' compiler pool.

A job of the eager kernel provider (``eager_kernels.py``) compiles one kernel: some
milliseconds of Python (graph passes, loop IR, rendering) and then a C compiler process,
which dominates (0.2-0.5 s a kernel on the 2-core dev box). A thread waiting on a
subprocess holds no GIL, so threads suffice, and a few: the compiler processes compete
with the user's own work for the CPUs.

Rules kept here, whatever the job:

* threads start on the first job (importing shapegrad starts none) and are daemons, and
  an ``atexit`` hook drops queued jobs: interpreter exit never waits for a compile (a
  compiler process already running finishes on its own and publishes atomically, or
  leaves a temporary file the cache's stale-temp sweep removes);
* the queue is bounded: :meth:`submit` answers False when it is full (the caller keeps
  running without the job's result and may ask again later);
* a job's exception never kills its thread (jobs report their own failures; one that
  escapes is handed to ``on_error``);
* after ``os.fork`` the child has none of the parent's threads: a fork hook forgets them
  and their jobs and makes new locks (a parent thread may have held one at the fork); the
  jobs' owner drops what it was waiting for in its own hook.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import os
import sys
import threading
import weakref
from collections.abc import Callable

Job = Callable[[], object]  # what it returns is dropped


class Pool:
    """Up to ``workers`` daemon threads running the jobs of a queue of ``capacity``."""

    def __init__(
        self,
        workers: int,
        capacity: int,
        name: str,
        on_error: Callable[[BaseException], None],
        nice: int = 0,
    ) -> None:
        if workers < 1 or capacity < 1:
            raise ValueError(f"Pool: workers ({workers}) and capacity ({capacity}) must be >= 1")
        self.workers = workers
        self.nice = nice
        self.capacity = capacity
        self.name = name
        self._on_error = on_error
        self._fresh_state()
        _POOLS.add(self)

    def _fresh_state(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._jobs: collections.deque[Job] = collections.deque()
        self._threads: list[threading.Thread] = []
        self._idle = 0  # threads waiting for a job
        self._running = 0  # jobs being run now
        self._closed = False

    def submit(self, job: Job) -> bool:
        """Queue ``job``; False (nothing queued) when the queue is full or the pool closed."""
        with self._cond:
            if self._closed or len(self._jobs) >= self.capacity:
                return False
            self._jobs.append(job)
            if self._idle == 0 and len(self._threads) < self.workers:
                thread = threading.Thread(
                    target=self._work, name=f"{self.name}-{len(self._threads)}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
            else:
                self._cond.notify()
            return True

    def pending(self) -> int:
        """Jobs queued or running."""
        with self._cond:
            return len(self._jobs) + self._running

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until no job is queued or running; False when ``timeout`` seconds passed first."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._jobs and not self._running, timeout)

    def close(self) -> None:
        """Drop queued jobs and accept no more (running ones finish; nobody waits for them)."""
        with self._cond:
            self._closed = True
            self._jobs.clear()
            self._cond.notify_all()

    def _reset_after_fork(self) -> None:
        """In a forked child: no threads, no jobs, new locks (the parent's jobs are gone)."""
        closed = self._closed
        self._fresh_state()
        self._closed = closed

    def _work(self) -> None:
        _lower_priority(self.nice)
        while True:
            with self._cond:
                self._idle += 1
                while not self._jobs and not self._closed:
                    self._cond.wait()
                self._idle -= 1
                if not self._jobs:  # closed
                    return
                job = self._jobs.popleft()
                self._running += 1
            try:
                job()
            except BaseException as exc:  # a job's failure must not kill the worker
                self._on_error(exc)
            finally:
                with self._cond:
                    self._running -= 1
                    self._cond.notify_all()


def _lower_priority(nice: int) -> None:
    """This thread's nice value raised by ``nice`` (Linux: per thread, and inherited by the
    processes it starts, e.g. a compiler). Elsewhere a process-wide call would slow the
    user's own threads too, so nothing changes there."""
    if nice <= 0 or not sys.platform.startswith("linux"):
        return
    tid = threading.get_native_id()
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + nice)


_POOLS: weakref.WeakSet[Pool] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for pool in list(_POOLS):
        pool.close()


def _after_fork_in_child() -> None:
    for pool in list(_POOLS):
        pool._reset_after_fork()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)
