"""Stopping and resuming: a real SIGINT sent to a `mugraph search` process stops it within a
second with the best verified kernel so far, exit 130 and no traceback; the next run of the same
search resumes from the checkpoint and says so. SIGTERM stops an in-process search the same way. In-process, a stop request that the
running code does not read becomes a KeyboardInterrupt that a swallowing GC callback cannot lose."""
from __future__ import annotations

import gc
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from mugraph.search import interrupt

SEARCH = [sys.executable, "-m", "mugraph", "search", "gated_mlp", "--small", "--budget", "30"]


def _start(env):
    proc = subprocess.Popen(SEARCH, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith("== searching"):
            return proc, "".join(seen)
    raise AssertionError(f"the search did not start: {proc.communicate()[1]}")


def _when_verified(folder, proc, after_states: int, limit: float = 60.0) -> None:
    """Wait until the search's checkpoint (saved every second) records a verified structure and
    more than `after_states` states, so the stopped search has a kernel to show."""
    from mugraph.search.cache import ResultCache
    store, start = ResultCache(folder), time.monotonic()
    while time.monotonic() - start < limit and proc.poll() is None:
        for _, _, note in store.checkpoints():
            found = re.search(r", (\d+) states, ([1-9]\d*) verified", note)
            if found and int(found.group(1)) > after_states:
                return
        time.sleep(0.2)
    raise AssertionError("no structure verified in time")


def _stop(proc, signum, folder, after_states: int = 0):
    _when_verified(folder, proc, after_states)
    sent = time.monotonic()
    proc.send_signal(signum)
    stopped_at = None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if stopped_at is None and line.startswith("== stopped"):
            stopped_at = time.monotonic() - sent
    err = proc.stderr.read()
    proc.wait(timeout=60)
    return proc.returncode, "".join(lines), err, stopped_at


def _states(message: str) -> int:
    return int(re.search(r"\((\d+) states", message).group(1))


@pytest.fixture
def env(tmp_path):
    return dict(os.environ, MUGRAPH_CACHE_DIR=str(tmp_path), PYTHONUNBUFFERED="1",
                MUGRAPH_PROGRESS="0")


def test_sigint_stops_the_search_in_a_second_and_the_next_run_resumes(env):
    folder = env["MUGRAPH_CACHE_DIR"]
    proc, _ = _start(env)
    rc, out, err, seconds = _stop(proc, signal.SIGINT, folder)
    assert rc == 130, err
    assert "Traceback" not in err and "search stopped by SIGINT" in err
    assert seconds is not None and seconds < 1.0, (seconds, out)
    assert "kernel graph" in out, "the best verified kernel so far is printed"
    first = _states(err)

    proc, head = _start(env)  # the same search again: it resumes, says so, and goes on
    assert "== resuming the search stopped at" in head and f"{first} states" in head
    rc, out, err, seconds = _stop(proc, signal.SIGINT, folder, after_states=first)
    assert rc == 130 and "Traceback" not in err
    assert _states(err) > first


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_an_unheeded_stop_becomes_a_keyboard_interrupt_that_a_gc_callback_cannot_swallow():
    swallowed = []

    def callback(phase, info):  # like JAX's: an exception raised in here is printed and dropped
        try:
            begun = time.perf_counter()
            while time.perf_counter() - begun < 0.002:  # Python work, as JAX's callback does
                pass
        except KeyboardInterrupt:
            swallowed.append(1)
            raise

    gc.callbacks.append(callback)
    threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()
    start = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            with interrupt.stoppable():
                while time.monotonic() - start < 10:  # code that never reads the stop flag
                    garbage = [[i] for i in range(2000)]  # Python work; young collections
                    gc.collect(0)                         # and their callbacks, about half
                    garbage.clear()                       # of the time
    finally:
        gc.callbacks.remove(callback)
    # each retry lands in the callback about half the time, more on a loaded machine; the bound
    # (well under the loop's 10 s) only says it was not swallowed for good
    assert time.monotonic() - start < 0.2 + interrupt.ESCALATE_AFTER + 50 * interrupt.RETRY_EVERY
    assert not swallowed, "a KeyboardInterrupt was raised inside the GC callback and lost"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_stop_request_ends_the_enumeration_with_what_was_verified():
    from mugraph import workloads
    from mugraph.errors import Interrupted
    from mugraph.search import SearchConfig
    from mugraph.search.cached import cached_search
    spec = workloads.get("gated_mlp").small().spec()
    threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM)).start()
    start = time.monotonic()
    with pytest.raises(Interrupted) as caught:
        cached_search(spec, SearchConfig(budget_seconds=30), cache=False, progress=lambda *a: 0)
    assert time.monotonic() - start < 2.0
    assert "search stopped by SIGTERM" in str(caught.value)
    assert "no checkpoint kept" in str(caught.value)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_superoptimize_stopped_raises_interrupted_with_a_kernel_as_its_result():
    """README: from Python, `superoptimize` raises Interrupted with the best kernel verified so far
    as `.result` — a Kernel that runs, not the search's internal record."""
    import numpy as np
    import mugraph
    from mugraph import ir, workloads
    from mugraph.api import Kernel
    from mugraph.errors import Interrupted
    w = workloads.get("gated_mlp").small()
    threading.Timer(1.5, os.kill, (os.getpid(), signal.SIGTERM)).start()
    with pytest.raises(Interrupted) as caught:
        mugraph.superoptimize(w.spec(), budget_seconds=30, cache=False, progress=False)
    kernel = caught.value.result
    assert isinstance(kernel, Kernel), type(kernel)
    assert "search stopped by SIGTERM" in kernel.origin
    arrays = w.random_inputs(0)
    want = ir.interpret(w.spec(), arrays)[0]
    assert np.allclose(kernel.run_reference(*arrays), want, rtol=1e-3, atol=1e-3)
