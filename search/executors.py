"""Where the search's coarse tasks run: in this process, a local process pool, or Dask.

A task is one subtree of the kernel-level enumeration (one first kernel op at one depth); it
returns the candidate structures it found and its counters. Every executor returns results in
task order, so a search that runs to exhaustion gives the same answer on each.
"""
from __future__ import annotations

import concurrent.futures as cf
import os
import signal
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


def _ignore_interrupts() -> None:
    """Workers leave Ctrl-C (sent to the whole process group) to the parent, which stops them."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class ProcessPool:
    """A local pool of worker processes (forkserver start, so workers begin from a clean state)."""

    name = "process-pool"

    def __init__(self, workers: int):
        self.workers = max(1, workers)
        import multiprocessing as mp
        method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
        self.pool = cf.ProcessPoolExecutor(self.workers, mp_context=mp.get_context(method),
                                           initializer=_ignore_interrupts)

    def map(self, fn, tasks):
        return self.pool.map(fn, list(tasks))

    def cancel(self) -> None:
        """Stop now: drop queued tasks and end the workers (a stopped search)."""
        processes = list(getattr(self.pool, "_processes", {}).values())
        self.pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            process.terminate()

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
        self.futures: list = []
        if address:
            self.client, self.cluster = _connect(Client, address), None
        else:
            self.cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                        dashboard_address=None)
            self.client = Client(self.cluster)

    def map(self, fn, tasks):
        self.futures = self.client.map(fn, list(tasks), pure=False)
        return (f.result() for f in self.futures)

    def cancel(self) -> None:
        """Stop now: cancel the tasks sent to the cluster."""
        self.client.cancel(self.futures)

    def close(self) -> None:
        self.client.close()
        if self.cluster is not None:
            self.cluster.close()


CONNECT_SECONDS = 10.0


def _connect(client_class, address: str):
    """A Dask client for `address`; SearchError naming the address when none answers."""
    if not isinstance(address, str) or not address.strip():
        raise SearchError(f"Dask scheduler address {address!r} is empty",
                          hint="e.g. --scheduler tcp://host:8786, or leave it out for a local cluster")
    try:
        return client_class(address, timeout=CONNECT_SECONDS)
    except (OSError, TimeoutError, ValueError) as e:
        raise SearchError(f"cannot reach the Dask scheduler at {address!r} within "
                          f"{CONNECT_SECONDS:.0f} s ({type(e).__name__}: {e})",
                          hint="check the address and that `dask scheduler` runs there; "
                               "--executor process-pool runs on this machine") from None


def make_executor(workers: int, kind: str | None = None, address: str | None = None) -> Executor:
    kind = kind or ("in-process" if workers <= 1 else "process-pool")
    if kind == "in-process":
        return InProcess()
    if kind == "process-pool":
        return ProcessPool(workers or os.cpu_count() or 1)
    if kind == "dask":
        return DaskExecutor(address or os.environ.get("MUGRAPH_DASK_SCHEDULER"), max(workers, 1))
    raise SearchError(f"unknown executor {kind!r}", hint="in-process, process-pool or dask")
