"""Sampled finite-field tests: the sampled evaluation of a graph (kernel ops on the rows and
columns the sampled tiles need, custom kernels on the blocks that write them) equals the full
evaluation on the sampled elements, for every workload's spec and hand-written kernel; a sampled
test says what its bound covers."""
from __future__ import annotations

import numpy as np
import pytest

from mugraph import ir, workloads
from mugraph.ir.interpret import interpret
from mugraph.verify import check, finite_field_test
from mugraph.verify.finite_field import make_draw
from mugraph.verify.sampling import (ALL, evaluate_sampled, hashed_input, plan, restrict,
                                     sample_sets)


def _full_outputs(graph, draw):
    arrays = {n.arg[0]: hashed_input(draw, n, (ALL,) * n.rank, True) for n in graph.inputs}
    return interpret(graph, arrays, semantics=draw.semantics(True))


@pytest.mark.parametrize("name", workloads.names())
@pytest.mark.parametrize("which", ["spec", "reference"])
def test_sampled_evaluation_equals_the_full_one_on_the_sampled_elements(name, which):
    w = workloads.get(name).small()
    graph = w.spec() if which == "spec" else w.reference()
    draw = make_draw(5, 0, 0)
    full = _full_outputs(graph, draw)
    rng = np.random.default_rng(7)
    for _ in range(2):
        sets = [sample_sets(o.shape, 1, rng) for o in graph.outputs]
        have, groups = plan(graph, sets)
        values = evaluate_sampled(graph, have, groups, draw, True)
        for out, s, expected in zip(graph.outputs, sets, full):
            got = restrict(values[out], have[out], s, out.shape)
            want = restrict(expected, (ALL,) * out.rank, s, out.shape)
            assert np.array_equal(got, want)


def test_sample_sets_are_whole_tiles_of_the_last_two_dims():
    for seed in range(5):
        sets = sample_sets((3, 256, 200), 2, np.random.default_rng(seed))
        assert 1 <= len(sets[0]) <= 2
        for s, n in zip(sets[1:], (256, 200)):
            tiles = np.unique(s // 64)
            assert 1 <= len(tiles) <= 2
            expected = np.concatenate([np.arange(64 * t, min(64 * t + 64, n)) for t in tiles])
            assert np.array_equal(s, expected)


def test_only_the_blocks_that_write_the_sample_run():
    w = workloads.get("rmsnorm_linear")                  # full shape: 96 blocks of 64 columns
    reference = w.reference()
    sets = [sample_sets(o.shape, 1, np.random.default_rng(0)) for o in reference.outputs]
    have, groups = plan(reference, sets)
    ((bg, _), group), = groups.items()
    assert bg.num_blocks == 96 and group.graph.num_blocks == 1
    assert [len(s) for s in have[reference.inputs[1]] if s is not ALL] == [64]   # W's columns


def test_a_sampled_test_passes_the_kernel_rejects_a_mutant_and_says_what_it_covers():
    w = workloads.get("rmsnorm_linear")                  # full shape: 16 x 6144 outputs
    spec, reference = w.spec(), w.reference()
    result = finite_field_test(spec, reference, seed=0, sample_blocks=3)
    assert result.passed and result.established and "the bound covers those elements only" in \
        result.sampled and "of 98304 elements" in result.sampled
    x, wt = spec.inputs
    wrong = ir.KernelGraph([x.rms_norm(1, 1e-5) @ wt], spec.inputs)   # another epsilon
    assert not finite_field_test(spec, wrong, seed=0, sample_blocks=1).passed


def test_sample_blocks_must_be_a_positive_count():
    x = ir.input("X", (4, 8), "float32")
    with pytest.raises(ir.InvalidInput, match="sample_blocks"):
        finite_field_test(ir.KernelGraph([x]), ir.KernelGraph([x]), sample_blocks=0)


def test_check_with_sampled_tiles_says_so_in_the_verdict_line():
    w = workloads.get("lora").small()
    report = check(w.spec(), w.reference(), seed=0, scale=w.input_scale, formal=False,
                   sample_blocks=1)
    assert report.equivalent and report.finite_field.sampled
    assert "the bound covers those elements only" in report.verdict_line()
