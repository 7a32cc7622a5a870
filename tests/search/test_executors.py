"""Executors (Dask) and the search command line on a tiny program: same answers, files written."""
from __future__ import annotations

import json
import textwrap

import jax
import jax.numpy as jnp
import pytest

from mugraph import ir
from mugraph.cli import main as cli
from mugraph.search import SearchConfig, search
from mugraph.search.executors import InProcess, make_executor

QUIET = dict(progress=lambda *a: None)
CONFIG = SearchConfig(max_kernel_ops=1, budget_seconds=120)


def exp_matmul(X, W):
    return jnp.exp(X @ W)


ARGS = [jax.ShapeDtypeStruct((32, 64), jnp.float16), jax.ShapeDtypeStruct((64, 64), jnp.float16)]


@pytest.fixture(scope="module")
def spec():
    return ir.from_jax(exp_matmul, *ARGS)


@pytest.fixture(scope="module")
def in_process(spec):
    return search(spec, CONFIG, executor=InProcess(), **QUIET)


def test_the_tiny_program_fuses_into_one_kernel(in_process):
    best = in_process.best
    assert len(best.custom_ops()) == 1
    assert not [n for n in best.nodes if n.op not in (ir.KOp.INPUT, ir.KOp.CUSTOM)]
    assert in_process.report.stop_reason == "exhausted"


def test_dask_local_cluster_gives_the_in_process_answer(spec, in_process):
    pytest.importorskip("dask.distributed")
    executor = make_executor(2, "dask")
    try:
        result = search(spec, CONFIG, executor=executor, **QUIET)
    finally:
        executor.close()
    assert result.best is in_process.best
    assert [c.graph for c in result.candidates] == [c.graph for c in in_process.candidates]
    assert result.report.states == in_process.report.states


def test_unknown_executor_is_a_typed_error():
    from mugraph.errors import SearchError
    with pytest.raises(SearchError, match="unknown executor 'gpu-farm'"):
        make_executor(2, "gpu-farm")


def test_cli_search_of_a_user_file_writes_the_winner(tmp_path, capsys):
    source = tmp_path / "prog.py"
    source.write_text(textwrap.dedent("""
        import jax, jax.numpy as jnp
        def f(X, W):
            return jnp.exp(X @ W)
        f_args = [jax.ShapeDtypeStruct((32, 64), jnp.float16),
                  jax.ShapeDtypeStruct((64, 64), jnp.float16)]
    """))
    out = tmp_path / "found"
    rc = cli(["search", f"{source}:f", "--budget", "120", "--max-kernel-ops", "1",
              "--out", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "the winning μGraph" in text and "estimated speedup" in text
    graph = ir.load(out / "graph.json")
    assert len(graph.custom_ops()) == 1
    assert "mg_mma_m16n8k16" in (out / "kernel.cu").read_text()
    assert "verification: EQUIVALENT" in (out / "report.txt").read_text()
    assert json.loads((out / "graph.json").read_text())["version"] >= 1


def test_cli_search_of_a_missing_file_is_a_clear_error(tmp_path, capsys):
    rc = cli(["search", f"{tmp_path}/nope.py:f", "--budget", "5"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "no such file" in err and "nope.py" in err
