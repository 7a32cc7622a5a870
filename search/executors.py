"""Where the search's coarse tasks run: in this process, a local process pool, or Dask.

A task is one subtree of the kernel-level enumeration (one first kernel op at one depth); it
returns the candidate structures it found and its counters. Every executor returns results in
task order, so a search that runs to exhaustion gives the same answer on each.
"""
from __future__ import annotations

import concurrent.futures as cf
import os
from typing import Callable, Iterable, Protocol

from mugraph.ir.errors import SearchError


class Executor(Protocol):
    name: str

    def map(self, fn: Callable, tasks: Iterable) -> Iterable: ...

    def close(self) -> None: ...


class InProcess:
    name = "in-process"

    def map(self, fn, tasks):
        for t in tasks:
            yield fn(t)

    def close(self) -> None:
        pass


class ProcessPool:
    """A local pool of worker processes (forkserver start, so workers begin from a clean state)."""

    name = "process-pool"

    def __init__(self, workers: int):
        self.workers = max(1, workers)
        import multiprocessing as mp
        method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
        self.pool = cf.ProcessPoolExecutor(self.workers, mp_context=mp.get_context(method))

    def map(self, fn, tasks):
        return self.pool.map(fn, list(tasks))

    def close(self) -> None:
        self.pool.shutdown(cancel_futures=True)


class DaskExecutor:
    """Tasks on a Dask cluster: `DaskExecutor("tcp://scheduler:8786")` or a LocalCluster."""

    name = "dask"

    def __init__(self, address: str | None = None, workers: int = 2):
        try:
            from dask.distributed import Client, LocalCluster
        except ImportError:
            raise SearchError("the Dask executor needs dask[distributed]",
                              hint="pip install 'mugraph[dask]'") from None
        if address:
            self.client, self.cluster = Client(address), None
        else:
            self.cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                        dashboard_address=None)
            self.client = Client(self.cluster)

    def map(self, fn, tasks):
        futures = self.client.map(fn, list(tasks), pure=False)
        return (f.result() for f in futures)

    def close(self) -> None:
        self.client.close()
        if self.cluster is not None:
            self.cluster.close()


def make_executor(workers: int, kind: str | None = None, address: str | None = None) -> Executor:
    kind = kind or ("in-process" if workers <= 1 else "process-pool")
    if kind == "in-process":
        return InProcess()
    if kind == "process-pool":
        return ProcessPool(workers or os.cpu_count() or 1)
    if kind == "dask":
        return DaskExecutor(address or os.environ.get("MUGRAPH_DASK_SCHEDULER"), max(workers, 1))
    raise SearchError(f"unknown executor {kind!r}", hint="in-process, process-pool or dask")
