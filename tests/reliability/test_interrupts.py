"""Stopping and resuming: a real SIGINT sent to a `mugraph search` process stops it within a
second with the best verified kernel so far, exit 130 and no traceback; the next run of the same
search resumes from the checkpoint and says so. SIGTERM stops an in-process search the same way. In-process, a stop request that the
running code does not read becomes a KeyboardInterrupt that a swallowing GC callback cannot lose."""
from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from mugraph.search import interrupt

SEARCH = [sys.executable, "-m", "mugraph", "search", "gated_mlp", "--small", "--budget", "4"]


def _start(env):
    proc = subprocess.Popen(SEARCH, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    for line in proc.stdout:
        if line.startswith("== searching"):
            return proc
    raise AssertionError(f"the search did not start: {proc.communicate()[1]}")


def _stop(proc, signum, after: float = 1.0):
    time.sleep(after)
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


@pytest.fixture
def env(tmp_path):
    return dict(os.environ, MUGRAPH_CACHE_DIR=str(tmp_path), PYTHONUNBUFFERED="1",
                MUGRAPH_PROGRESS="0")


def test_sigint_stops_the_search_in_a_second_and_the_next_run_resumes(env):
    rc, out, err, seconds = _stop(_start(env), signal.SIGINT)
    assert rc == 130, err
    assert "Traceback" not in err and "search stopped by SIGINT" in err
    assert seconds is not None and seconds < 1.0, (seconds, out)
    assert "kernel graph" in out, "the best verified kernel so far is printed"

    done = subprocess.run(SEARCH, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "resumed from a checkpoint saved" in done.stdout
    assert "stop reason: time" in done.stdout or "stop reason: exhausted" in done.stdout


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_an_unheeded_stop_becomes_a_keyboard_interrupt_that_a_gc_callback_cannot_swallow():
    swallowed = []

    def callback(phase, info):  # like JAX's: an exception raised in here is printed and dropped
        try:
            time.sleep(0.004)
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
                    gc.collect()                       # about half the time in the callback
                    time.sleep(0.008)
    finally:
        gc.callbacks.remove(callback)
    assert time.monotonic() - start < 0.2 + interrupt.ESCALATE_AFTER + 20 * interrupt.RETRY_EVERY
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
