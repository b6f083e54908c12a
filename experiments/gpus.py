"""One GPU per job when a Hydra launcher runs several jobs of a host side by side (hydra/launcher=joblib,
n_jobs = gpus): each job holds the first GPU no other job of the host holds, for its whole life. Which
jobs run when is the launcher's; this only says where."""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

LOCKS = Path(tempfile.gettempdir()) / "grace-gpus"


@contextlib.contextmanager
def one_of(count: int | None) -> Iterator[int | None]:
    """With `count` GPUs, hold one (CUDA_VISIBLE_DEVICES names it for this process and its workers) until
    the block ends; None: leave the devices as they are."""
    if not count:
        yield None
        return
    LOCKS.mkdir(exist_ok=True)
    while True:  # more jobs than GPUs (n_jobs > gpus): wait for one to finish
        for gpu in range(count):
            handle = open(LOCKS / f"{gpu}.lock", "w")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                continue
            os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu)
            try:
                yield gpu
            finally:
                handle.close()
            return
        time.sleep(1)
