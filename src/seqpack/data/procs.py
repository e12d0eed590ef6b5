"""Worker processes for record preparation: start, feed, collect in order, detect a dead worker.

:class:`WorkerProcesses` runs ``num_proc`` processes started with the ``spawn`` method (a fork of a process
whose threads may hold locks, e.g. the tokenizer's Rust thread pool or Arrow's, can deadlock the child).
Each worker loads the tokenizer once (pickled by the parent), then takes tasks from one shared queue, so a
free worker always takes the next chunk, and puts ``(task id, pickled result)`` on a result queue; the
parent hands results back in task order.

A worker that dies (killed by the out-of-memory killer, a segfault in native code, ``os._exit``) is found
within :data:`POLL_S` seconds of the parent waiting on it and raises :class:`WorkerDiedError` naming the
exit code or signal; the parent never waits forever on a lost task. Workers ignore SIGINT (Ctrl-C
reaches the parent, which stops them) and end within :data:`POLL_S` seconds of an idle wait when the
parent dies (SIGKILL). They start from a bare ``__main__`` module, so the caller's script is not run
again in each worker and needs no ``if __name__ == "__main__"`` guard.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import queue
import signal
import sys
import traceback
import types
from typing import Any, Callable

__all__ = ["POLL_S", "WorkerDiedError", "WorkerProcesses", "available_cores"]

#: seconds between liveness checks of the workers while the parent waits for a result
POLL_S = 0.5


class WorkerDiedError(RuntimeError):
    """A preparation worker process ended without returning its work (message: exit code or signal,
    the records in flight, and the fix)."""


def available_cores() -> int:
    """CPU cores this process may run on (``len(os.sched_getaffinity(0))`` where the OS has it, else
    ``os.cpu_count()``); at least 1."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def _exit_text(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        why = " (the out-of-memory killer sends it)" if -code == signal.SIGKILL else ""
        return f"was killed by {name}{why}"
    return f"exited with code {code}"


def _worker_main(tasks: Any, results: Any, init: Callable[..., Any], init_args: tuple,
                 run: Callable[..., Any]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        state = init(*init_args)
    except BaseException:  # noqa: BLE001 - reported to the parent, then this worker ends
        results.put((-1, "init", traceback.format_exc()))
        return
    parent = mp.parent_process()
    while True:
        try:
            task = tasks.get(timeout=POLL_S)
        except queue.Empty:
            if parent is not None and not parent.is_alive():  # the parent was killed: do not linger
                return
            continue
        if task is None:
            return
        tid, args = task
        try:
            payload = pickle.dumps(run(state, *args), protocol=pickle.HIGHEST_PROTOCOL)
        except BaseException:  # noqa: BLE001 - run() returns errors as values; this is a bug or unpicklable data
            results.put((tid, "error", traceback.format_exc()))
            continue
        results.put((tid, "ok", payload))


class WorkerProcesses:
    """``num_proc`` spawned processes that run ``run(init(*init_args), *args)`` for each submitted task.

    Args:
        num_proc: number of processes (>= 1).
        init: picklable module-level function called once in each worker; returns the worker's state.
        init_args: its (picklable) arguments.
        run: picklable module-level function ``run(state, *args) -> result`` (result picklable).
        env: environment variables set in the workers (e.g. a thread count), on top of this process's.

    Raises (from :meth:`result`):
        WorkerDiedError: a worker died, failed to start, or a task failed outside ``run``'s own error handling.
    """

    def __init__(self, num_proc: int, init: Callable[..., Any], init_args: tuple, run: Callable[..., Any],
                 env: dict[str, str] | None = None) -> None:
        ctx = mp.get_context("spawn")
        self.tasks = ctx.Queue()
        self.results = ctx.Queue()
        self._done: dict[int, Any] = {}
        self._next_id = 0
        self.procs = []
        main = sys.modules.get("__main__")
        # spawn re-runs the caller's __main__ module in every child unless it is hidden: a script without an
        # ``if __name__ == "__main__"`` guard would start the whole job again in each worker
        sys.modules["__main__"] = types.ModuleType("__main__")
        old_env = {k: os.environ.get(k) for k in (env or {})}
        os.environ.update(env or {})
        try:
            for _ in range(num_proc):
                p = ctx.Process(target=_worker_main, args=(self.tasks, self.results, init, init_args, run), daemon=True)
                p.start()
                self.procs.append(p)
        except BaseException:
            self.close(kill=True)
            raise
        finally:
            if main is not None:
                sys.modules["__main__"] = main
            for k, v in old_env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def submit(self, *args: Any) -> int:
        """Queue a task; returns its id (ids count up from 0 in submit order)."""
        tid = self._next_id
        self._next_id += 1
        self.tasks.put((tid, args))
        return tid

    def result(self, tid: int, what: Callable[[], str] = lambda: "records") -> Any:
        """The result of task ``tid`` (waits; results of other tasks that arrive meanwhile are kept).

        Args:
            what: describes the work in flight for an error message (called only on failure).

        Raises:
            WorkerDiedError: a worker ended without its result, or the task failed outside ``run``.
        """
        grace = True  # after a worker is found dead, one more wait for what it sent before dying
        while tid not in self._done:
            if not self.procs:
                raise WorkerDiedError("the preparation workers were stopped before this result arrived")
            try:
                got, status, payload = self.results.get(timeout=POLL_S)
            except queue.Empty:
                dead = [p for p in self.procs if p.exitcode is not None]
                if dead and grace:
                    grace = False
                    continue
                if dead:
                    p = dead[0]
                    self.close(kill=True)
                    raise WorkerDiedError(
                        f"a preparation worker process (pid {p.pid}) {_exit_text(p.exitcode)} while {what()} were "
                        "being prepared; nothing was written. Fix: use fewer processes (num_proc=N; "
                        "each holds a copy of the tokenizer and its share of the records) or give the job more "
                        "memory; num_proc=1 prepares in this process."
                    ) from None
                continue
            if status == "init":
                self.close(kill=True)
                raise WorkerDiedError(f"a preparation worker process could not start:\n{payload}")
            if status == "error":
                self.close(kill=True)
                raise WorkerDiedError(f"a preparation worker failed while {what()} were being prepared:\n{payload}")
            self._done[got] = payload
        return pickle.loads(self._done.pop(tid))

    def close(self, kill: bool = False) -> None:
        """Stop the workers: ask them to finish (``kill=False``) or terminate them at once."""
        procs, self.procs = self.procs, []
        if not kill:
            for _ in procs:
                self.tasks.put(None)
            for p in procs:
                p.join(timeout=5)
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
        for q in (self.tasks, self.results):
            q.cancel_join_thread()
            q.close()
