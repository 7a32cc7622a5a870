"""Watching a search: log lines every few seconds where stderr is not a terminal, a live line on
one; `superoptimize` takes `budget_seconds=` and `config=` as a SearchConfig or a dict."""
from __future__ import annotations

import io
import time

import jax
import jax.numpy as jnp
import pytest

import mugraph
from mugraph.errors import InvalidInput, SearchError
from mugraph.search import SearchConfig, progress
from mugraph.search.context import Counters


def test_log_lines_name_states_verified_best_and_elapsed_against_the_budget(monkeypatch):
    monkeypatch.setattr(progress, "LOG_EVERY", 0.05)
    stream = io.StringIO()
    show = progress.Progress(30.0, stream=stream, live=False)
    show(Counters(states=1200, verified=0), None, 0.0)
    time.sleep(0.12)
    show(Counters(states=45000, verified=3), 4.6e-6, 0.1)
    time.sleep(0.12)
    show.close()
    lines = stream.getvalue().splitlines()
    assert len(lines) >= 2 and "\r" not in stream.getvalue()
    assert "of 30 s" in lines[-1] and "45,000 states" in lines[-1]
    assert "3 verified" in lines[-1] and "best estimate 4.60 us" in lines[-1]


def test_a_terminal_gets_one_live_line_ended_by_close(monkeypatch):
    monkeypatch.setattr(progress, "LIVE_EVERY", 0.05)
    stream = io.StringIO()
    show = progress.Progress(10.0, stream=stream, live=True,
                             in_flight=lambda: (1, 500))  # a task still running: its states count
    time.sleep(0.12)
    show.close()
    text = stream.getvalue()
    assert text.startswith("\r") and text.endswith("\n") and "500 states" in text


def test_superoptimize_from_python_logs_progress_and_takes_the_budget(monkeypatch, capsys):
    monkeypatch.setattr(progress, "LOG_EVERY", 0.01)   # a line even if the search ends early
    monkeypatch.setenv("MUGRAPH_PROGRESS", "1")
    args = [jax.ShapeDtypeStruct((16, 64), jnp.float16), jax.ShapeDtypeStruct((64, 64), jnp.float16)]
    kernel = mugraph.superoptimize(lambda x, w: jax.nn.relu(x @ w) * 2.0, *args,
                                   config={"max_kernel_ops": 1}, budget_seconds=1.5, cache=False)
    err = capsys.readouterr().err
    assert "mugraph search:" in err and "of 2 s" in err  # (the budget, 1.5 s, shown rounded)
    assert '"budget_seconds": 1.5' in kernel.report.config


@pytest.mark.parametrize("config, error, match", [
    ("fast", InvalidInput, "SearchConfig or a dict"),
    ({"budget": 10}, SearchError, "unknown SearchConfig fields"),
    ({"budget_seconds": "10"}, SearchError, "positive, finite number"),
    ({"target": "v100"}, SearchError, "unknown target"),
])
def test_a_bad_config_is_a_typed_error(config, error, match):
    with pytest.raises(error, match=match):
        mugraph.superoptimize(mugraph.workloads.get("lora").small().spec(), config=config)


def test_a_config_dict_is_a_search_config():
    from mugraph.api import make_config
    assert make_config({"max_kernel_ops": 2}, budget_seconds=5) == \
        SearchConfig(max_kernel_ops=2, budget_seconds=5.0)
    assert make_config(SearchConfig(target="a100")).target == "a100"
