"""A fixed background load for benches: processes that each keep one core busy beside the engine, as a
browser or a build does on a user's machine (`bench --demo --load N`)."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Iterator
from contextlib import contextmanager


def _spin() -> None:  # pragma: no cover - runs in the child until it is stopped
    while True:
        pass


@contextmanager
def busy_cores(count: int) -> Iterator[list[int]]:
    """`count` busy processes (their pids) for the body's length, stopped and reaped however it ends."""
    context = multiprocessing.get_context("spawn")  # a fork would copy the engine's threads and memory
    workers = [context.Process(target=_spin, daemon=True) for _ in range(count)]
    try:
        for worker in workers:
            worker.start()
        yield [worker.pid for worker in workers if worker.pid is not None]
    finally:
        for worker in workers:
            if worker.is_alive():
                worker.kill()
            worker.join(timeout=5)


def wait_policy() -> str | None:
    """The OpenMP wait policy this process's torch threads run under (None: OpenMP's default, spinning)."""
    return os.environ.get("OMP_WAIT_POLICY")
