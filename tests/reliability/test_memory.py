"""Bounded memory for the whole call: sizing, checks and re-sizing never allocate in proportion
to a tile or tensor past `settings.memory_limit` (MUGRAPH_MEMORY_LIMIT). Past it a check is
sampled (and says so) or refused with a ResourceError naming the size and the fix; never an OOM
kill or a raw MemoryError. The limits are lowered here: nothing large is ever allocated."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import tracemalloc

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mugraph
from mugraph import ir
from mugraph.errors import InvalidInput, ResourceError
from mugraph.ir import memory
from mugraph.ir.settings import settings

S = jax.ShapeDtypeStruct


@pytest.fixture
def limit_100mb(monkeypatch):
    monkeypatch.setenv("MUGRAPH_MEMORY_LIMIT", "100MB")


def relu_matmul(x, w):
    return jax.nn.relu(x) @ w


def _pair(n: int, dtype=jnp.float32):
    """relu(x) @ w at n x n, and the same program with the relu fused into a kernel's prologue."""
    from mugraph.ir import BlockBuilder
    spec = ir.from_jax(relu_matmul, S((n, n), dtype), S((n, n), dtype))
    x, w = spec.inputs
    b = BlockBuilder(grid=(n // 64, n // 64, 1), forloop=n // 64)
    t = b.input(x, imap=(0, None, None), fmap=1).relu() @ b.input(w, imap=(None, 1, None), fmap=0)
    return spec, ir.KernelGraph(b.finish([(t.acc_sum(), (0, 1, None))]))


# ---- the setting ------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, value", [("64GB", 64 * 10**9), ("512MiB", 512 * 2**20),
                                         ("2e9", 2 * 10**9), ("1.5g", 1.5e9), ("123456789", 123456789)])
def test_the_limit_reads_sizes_with_units(monkeypatch, text, value):
    monkeypatch.setenv("MUGRAPH_MEMORY_LIMIT", text)
    assert settings.memory_limit == value


def test_the_default_limit_is_half_the_memory_this_process_can_take(monkeypatch):
    monkeypatch.delenv("MUGRAPH_MEMORY_LIMIT", raising=False)
    half = memory.available_bytes() / 2
    assert abs(settings.memory_limit - half) < 0.05 * half + 2**26
    monkeypatch.setenv("MUGRAPH_MEMORY_LIMIT", "80%")
    assert abs(settings.memory_limit - 1.6 * half) < 0.05 * half + 2**26


@pytest.mark.parametrize("text", ["nan", "-1GB", "0%", "150%", "lots", "1e999", "12 parsecs"])
def test_a_bad_limit_names_the_variable(monkeypatch, text):
    monkeypatch.setenv("MUGRAPH_MEMORY_LIMIT", text)
    with pytest.raises(InvalidInput, match="MUGRAPH_MEMORY_LIMIT"):
        settings.memory_limit


# ---- sizing: the swizzle self-check -----------------------------------------------------------------
def test_a_shared_memory_layout_of_two_billion_elements_is_checked_in_bounded_memory():
    """The swizzle's bijection check once built an index array over the whole tile: 16 GB for the
    2^31-element tiles sizing tries at 65536 x 65536. It now checks one period (exactly)."""
    from mugraph.codegen.fragments import SmemLayout, Swizzle, choose_smem_layout
    tracemalloc.start()
    start = time.perf_counter()
    layout = SmemLayout(32768, 65536, 2, swizzle=Swizzle(3, 3, 13))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert layout.size == 2**31 and peak < 64 * 2**20 and time.perf_counter() - start < 2.0
    small = choose_smem_layout(64, 64, 2)                 # the windows check what the whole did
    offsets = {small.offset(r, c) for r in range(64) for c in range(64)}
    assert offsets == set(range(64 * 64))


# ---- checks -----------------------------------------------------------------------------------------
def test_a_finite_field_test_past_the_limit_samples_output_tiles_and_says_so(limit_100mb):
    from mugraph.verify.finite_field import finite_field_test
    spec, fused = _pair(2048)
    assert memory.evaluation_bytes([spec, fused], 16) > 100e6
    tracemalloc.start()
    result = finite_field_test(spec, fused, tests=2, seed=0)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert result.passed and "random 64x64 tiles" in result.sampled and peak < 100e6
    wrong = ir.from_jax(lambda x, w: jax.nn.relu(x) @ w + x, *[S((2048, 2048), jnp.float32)] * 2)
    assert not finite_field_test(spec, wrong, tests=2, seed=0).passed


def test_a_float_test_past_the_limit_is_a_typed_error_naming_size_and_fix(limit_100mb):
    from mugraph.verify import check
    spec, fused = _pair(2048)
    with pytest.raises(ResourceError) as caught:
        check(spec, fused, seed=0)
    text = str(caught.value)
    assert "the float test of the program of x:f32[2048,2048], w:f32[2048,2048]" in text
    assert "above mugraph's limit of 100.0 MB" in text and "MUGRAPH_MEMORY_LIMIT" in text


def test_the_reference_interpreter_refuses_before_it_allocates(limit_100mb):
    spec, _ = _pair(8192)
    views = [np.broadcast_to(np.float32(1), (8192, 8192))] * 2      # no memory behind them
    with pytest.raises(ResourceError, match="evaluating the program of x:f32"):
        ir.interpret(spec, views)


def test_the_check_at_the_real_shapes_samples_blocks_to_fit_the_limit(limit_100mb):
    from mugraph.search.final_check import check_bytes, plan
    spec, fused = _pair(2048)
    pair = plan(spec, fused)
    assert "sampled output blocks" in pair.sampled
    assert check_bytes(pair.spec, pair.candidate) <= 100e6


def test_a_candidate_whose_check_cannot_fit_is_left_unchecked_and_the_report_says_why(
        limit_100mb):
    """concat is not sampled by cutting indices: at 2048 x 2048 the whole check needs more than
    the limit, so the candidate is not checked, and the spec (which needs no check) wins."""
    import dataclasses
    from mugraph.search import SearchConfig, search
    from mugraph.search.cost import estimate
    from mugraph.search.result import Candidate
    from mugraph.search.runner import _check_ranked
    args = [S((2048, 2048), jnp.float32)] * 2
    spec = ir.from_jax(lambda x, y: jnp.concatenate([jax.nn.relu(x), y * 2.0], axis=0), *args)
    other = ir.from_jax(lambda x, y: jnp.concatenate([jax.nn.relu(x), y + y], axis=0), *args)
    ranked = [Candidate(g, estimate(g, "h100"), "", origin) for g, origin in
              ((other, "search"), (spec, "spec"))]
    outcome = _check_ranked(spec, ranked, SearchConfig(), float("inf"))
    assert [c.graph for c in outcome.ranked] == [spec] and outcome.unchecked == 1
    assert outcome.unchecked_why.startswith("the check at the real shapes of the program of "
                                            "x:f32[2048,2048], y:f32[2048,2048] needs about")
    small = ir.from_jax(lambda x: x * 2.0, S((8, 8), jnp.float32))
    report = search(small, SearchConfig(max_kernel_ops=1), progress=False).report
    shown = str(dataclasses.replace(report, unchecked=1, unchecked_why=outcome.unchecked_why))
    assert "not checked at the real shapes (the check at the real shapes of the program" in shown


# ---- the whole call under an address-space limit ----------------------------------------------------
_UNDER_LIMIT = textwrap.dedent("""
    import resource, sys
    resource.setrlimit(resource.RLIMIT_AS, (BYTES, BYTES))
    import jax, jax.numpy as jnp, mugraph
    from mugraph.errors import ResourceError
    from mugraph import verify, ir
    n = EXTENT
    args = [jax.ShapeDtypeStruct((n, n), jnp.float16)] * 2
    spec = ir.from_jax(lambda x, w: jax.nn.relu(x) @ w, *args)
    print("sampled:", verify.quick_equivalent(spec, spec, tests=1))
    try:
        verify.check(spec, spec, seed=0)
        print("checked")
    except ResourceError as e:
        print("typed:", str(e).splitlines()[0])
""")


def test_a_full_shape_check_under_an_address_space_limit_is_a_typed_error_not_a_memory_error(
        tmp_path):
    """8192^2 fp16 under a 4 GB address space: the check of every element would take ~10 GB;
    the finite-field test samples and the float test refuses, naming the size (the default
    limit is half the room RLIMIT_AS leaves)."""
    script = _UNDER_LIMIT.replace("BYTES", str(4 * 2**30)).replace("EXTENT", "8192")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300, env=dict(os.environ, MUGRAPH_CACHE_DIR=str(tmp_path)))
    assert out.returncode == 0, out.stderr[-2000:]
    assert "MemoryError" not in out.stderr, out.stderr[-2000:]
    assert out.stdout.splitlines() == ["sampled: True", out.stdout.splitlines()[1]], out.stdout
    assert out.stdout.splitlines()[1].startswith("typed: the float test of the program of "
                                                 "x:f16[8192,8192]"), out.stdout
