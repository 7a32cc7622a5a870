"""Full-shape kernels on the CPU harness: a sample of each kernel's blocks (first, last, every corner of the grid,
one at random, with all the CTAs of a split loop) against the interpreter, for every workload."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from mugraph import workloads
from mugraph.codegen import sample
from mugraph.codegen.sample import run_sampled, sample_blocks

TOLERANCE = 1e-2


@pytest.mark.parametrize("name", workloads.names())
def test_sampled_blocks_of_the_full_shape_kernels_match_the_interpreter(name):
    w = workloads.get(name)
    checks = run_sampled(w.reference(), w.random_inputs(0), arch="sm_90", picks=1)
    assert checks and all(c.blocks for c in checks)
    for c in checks:
        assert c.max_error <= TOLERANCE, str(c)


def test_the_sample_holds_first_last_corners_and_random_blocks():
    grid = (96, 2, 3)
    blocks = sample_blocks(grid, picks=4, seed=7)
    corners = set(itertools.product((0, 95), (0, 1), (0, 2)))
    assert corners <= set(blocks) and len(blocks) == len(corners) + 4
    assert blocks[0] == (0, 0, 0) and blocks[-1] == (95, 1, 2)
    assert blocks == sample_blocks(grid, picks=4, seed=7) != sample_blocks(grid, picks=4, seed=8)
    assert sample_blocks((1, 1, 1), picks=3) == [(0, 0, 0)]


def test_block_regions_tile_each_output_once():
    g = workloads.get("gqa").small().reference()
    for bg, _ in g.custom_ops():
        for out in bg.outputs:
            hits = np.zeros(out.shape, np.int64)
            for b in itertools.product(*[range(n) for n in bg.grid]):
                hits[sample._tile_region(out, b)] += 1
            assert (hits == 1).all()


def test_a_wrong_tile_is_caught(monkeypatch):
    """The check can fail: shift the interpreter's answer and the sampled tiles disagree."""
    real = sample.interpret
    monkeypatch.setattr(sample, "interpret", lambda g, a: [v + 1.0 for v in real(g, a)])
    w = workloads.get("ntrans").small()
    (check,) = run_sampled(w.reference(), w.random_inputs(0), picks=0)
    assert check.max_error > 0.1


def test_a_split_loop_at_full_shape_runs_every_cta_of_its_sampled_blocks():
    from tests.gpu.test_workloads_gpu import _split_graph
    g = _split_graph()
    rng = np.random.default_rng(5)
    arrays = [(rng.standard_normal(s) * 0.5).astype(np.float16) for s in ((16, 4096), (4096, 384))]
    (check,) = run_sampled(g, arrays, picks=0)
    assert check.splits > 1 and check.max_error <= TOLERANCE, str(check)
