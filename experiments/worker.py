"""One Bench in its own process, so that variants share no dynamo state and no compile caches.

The parent calls Bench methods by name over a pipe; the worker answers ("ok", value) or ("error", text).
A worker that dies or stops answering becomes a WorkerError in the parent, never a crashed sweep. A worker
gets itself ready (Bench.ready) as soon as it starts, so that workers started together import and make
their CUDA contexts side by side, before any of them is asked for anything else.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import tempfile
import time
from typing import Any

import torch

from experiments.bench import Bench, Spec
from experiments.tp_bench import TPBench

log = logging.getLogger(__name__)


class WorkerError(RuntimeError):
    pass


def _serve(conn, spec: Spec) -> None:
    # Ctrl-C reaches the whole process group: a worker leaves on it whatever its parent ignored (a process
    # that ignores SIGINT passes that on to the workers it starts)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # ignore_cleanup_errors: a worker stopped mid-compile (SIGINT) may still have Triton writing there.
    with tempfile.TemporaryDirectory(prefix="grace-caches-", ignore_cleanup_errors=True) as caches:
        if spec.cold_caches:  # compile latency not flattered by another variant's artifacts
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(caches, "inductor")
            os.environ["TRITON_CACHE_DIR"] = os.path.join(caches, "triton")
        bench = TPBench(spec) if spec.tp > 1 else Bench(spec)
        try:
            _answer(conn, bench)
        except KeyboardInterrupt:  # Ctrl-C reaches the whole process group: the parent records and closes
            pass
        finally:
            # Leaving: a Ctrl-C now could only break the exit's own cleanup (a spawned worker runs
            # Inductor's atexit, which waits for its compile subprocesses) with a traceback of its own
            signal.signal(signal.SIGINT, signal.SIG_IGN)


def _answer(conn, bench) -> None:
    while True:
        try:
            method, args = conn.recv()
        except EOFError:
            return
        if method == "close":
            bench.close()
            return
        try:
            conn.send(("ok", getattr(bench, method)(*args)))
        except Exception as e:  # reported to the parent, which records it
            conn.send(("error", f"{method}: {type(e).__name__}: {e}".splitlines()[0]))


def _context():
    """Without CUDA, workers fork from a server process that has imported torch and the harness once
    (forkserver), so that each starts in a fraction of a second instead of importing them again. With
    CUDA they are spawned: asking for the device count in the server (imports do) poisons its forks for
    CUDA ("Cannot re-initialize CUDA in forked subprocess")."""
    if torch.cuda.is_available():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["experiments.bench", "experiments.tp_bench"])
    return ctx


class Worker:
    def __init__(self, spec: Spec, timeout_s: float):
        if mp.get_start_method(allow_none=True) not in (None, *mp.get_all_start_methods()):
            # a job of joblib's launcher runs in a loky process, whose start method a forked child lacks
            mp.set_start_method("spawn", force=True)
        ctx = _context()
        self._conn, child = ctx.Pipe()
        # Not a daemon: Inductor starts compile subprocesses of its own.
        self._proc = ctx.Process(target=_serve, args=(child, spec), name=f"bench-{spec.workload}-{spec.variant.name}")
        self._began = time.monotonic()
        self._proc.start()
        child.close()
        self.timeout_s = timeout_s
        self.variant = spec.variant.name
        self._start_s: float | None = None
        self._closing = False
        self._send("ready")

    def ready(self) -> float:
        """Waits until the worker is ready; returns the seconds from its start until then."""
        if self._start_s is None:
            self._start_s = self.reply() - self._began
        return self._start_s

    def request(self, method: str, *args: Any) -> None:
        """Ask the worker to run `method` (once it is ready); reply() waits for the answer."""
        self.ready()
        self._send(method, *args)

    def _send(self, method: str, *args: Any) -> None:
        self._method = method
        try:
            self._conn.send((method, args))
        except OSError:
            pass  # a dead worker: reply() says so

    def reply(self) -> Any:
        method = self._method
        try:
            if not self._conn.poll(self.timeout_s):
                self.close()
                raise WorkerError(f"{method}: no answer within {self.timeout_s:.0f} s")
            status, value = self._conn.recv()
        except (EOFError, OSError):
            self._proc.join(10)
            raise WorkerError(f"{method}: worker process died (exit code {self._proc.exitcode})") from None
        if status == "error":
            raise WorkerError(value)
        return value

    def call(self, method: str, *args: Any) -> Any:
        self.request(method, *args)
        return self.reply()

    def ask_to_close(self) -> None:
        """Ask the worker to finish, without waiting: workers asked together exit side by side."""
        if self._proc.is_alive() and not self._closing:
            self._closing = True
            try:
                self._conn.send(("close", ()))
            except OSError:
                pass

    def close(self, wait_s: float = 60) -> None:
        """Ask the worker to finish and wait up to `wait_s` for it, then kill it (0: at once, as when the
        sweep is being stopped: a worker may be stuck in a collective its peers left)."""
        self.ask_to_close()
        if self._proc.is_alive():
            self._proc.join(wait_s)
        if self._proc.is_alive():
            if wait_s:
                log.warning("%s: still running %.0f s after being asked to close; killed", self._proc.name, wait_s)
            self._proc.kill()
            self._proc.join()
        self._conn.close()
