"""Mutation testing: for every workload, valid non-equivalent mutants of the hand-written fused
μGraph (schedule maps, accumulators, operands, ops, constants) are all rejected by `check`, and the
original is accepted. The kill rate is a test, not a figure."""
from __future__ import annotations

import pytest

from mugraph import ir, workloads
from mugraph.verify import check, generate_mutants, quick_equivalent, rewrite
from mugraph.verify.mutate import replace_block, rewrite_block

MIN_MUTANTS = 20
LIMIT = 40  # per workload in the default suite (seeded order); the slow tests take them all
KINDS = {"imap", "fmap", "omap", "off-by-one", "accumulator", "swap", "drop", "duplicate",
         "constant", "wrong-op", "wrong-operand"}


def _reference(name):
    w = workloads.get(name).small()
    return w, w.reference()


def _assert_all_killed(original, found, scale, seed=0):
    assert check(original, original, seed=seed, scale=scale, formal=False).equivalent
    survivors = [m.description for m in found.mutants
                 if check(original, m.graph, seed=seed, scale=scale, formal=False).equivalent]
    assert not survivors, f"check accepted {len(survivors)} mutants: {survivors}"


@pytest.mark.parametrize("name", workloads.names())
def test_check_rejects_every_mutant_of_the_reference(name):
    w, reference = _reference(name)
    found = generate_mutants(reference, seed=0, limit=LIMIT, scale=w.input_scale)
    assert len(found.mutants) >= MIN_MUTANTS, found
    _assert_all_killed(reference, found, w.input_scale)


@pytest.mark.parametrize("name", workloads.names())
def test_the_field_test_alone_rejects_every_mutant(name):
    # the search's fast path: one exact test, no float run
    w, reference = _reference(name)
    found = generate_mutants(reference, seed=1, limit=LIMIT, scale=w.input_scale)
    survivors = [m.description for m in found.mutants if quick_equivalent(reference, m.graph)]
    assert not survivors


def test_the_mutants_cover_every_kind_across_the_suite():
    kinds = set()
    for name in workloads.names():
        w, reference = _reference(name)
        kinds |= set(generate_mutants(reference, scale=w.input_scale).kinds())
    assert KINDS <= kinds, f"missing kinds {KINDS - kinds}"


def test_equivalent_mutants_are_discarded_and_counted():
    # ntrans's block has forloop 1 and no looped input: other trip counts of its schedule, and
    # other mutations, include some that compute the same function
    w, reference = _reference("ntrans")
    found = generate_mutants(reference, scale=w.input_scale)
    assert found.equivalent > 0 and found.invalid > 0
    assert all(m.graph is not reference for m in found.mutants)
    assert len({m.graph for m in found.mutants}) == len(found.mutants)


@pytest.mark.slow
@pytest.mark.parametrize("name", workloads.names())
def test_check_rejects_every_mutant_at_small_shapes_unlimited(name):
    w, reference = _reference(name)
    found = generate_mutants(reference, seed=2, scale=w.input_scale)
    _assert_all_killed(reference, found, w.input_scale, seed=2)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["lora", "ntrans", "gqa"])
def test_check_rejects_mutants_at_full_shape(name):
    w = workloads.get(name)
    reference = w.reference()
    found = generate_mutants(reference, seed=3, limit=MIN_MUTANTS, scale=w.input_scale)
    assert len(found.mutants) >= MIN_MUTANTS
    _assert_all_killed(reference, found, w.input_scale, seed=3)


def test_spec_level_mutants_are_rejected():
    for name in ("rmsnorm_linear", "gqa_safe", "ntrans"):
        w = workloads.get(name).small()
        spec = w.spec()
        found = generate_mutants(spec, seed=0, limit=25, scale=w.input_scale)
        assert len(found.mutants) >= 15
        _assert_all_killed(spec, found, w.input_scale)


# ---- schedule mutants on a square-tile graph, where every map change keeps shapes valid ----------
def _square_tiles():
    x, w = ir.input("X", (2, 64, 64), "float16"), ir.input("W", (2, 64, 64), "float16")
    b = ir.BlockBuilder(grid=(2, 2, 2), forloop=2)
    tx = b.input(x, imap=(0, 1, None), fmap=2)     # [1, 32, 32] tiles
    tw = b.input(w, imap=(0, None, 2), fmap=1)
    (out,) = b.finish([((tx @ tw).acc_sum(), (0, 1, 2))])
    return ir.KernelGraph([out], [x, w])


def test_schedule_mutants_of_a_square_tile_matmul_are_valid_and_killed():
    graph = _square_tiles()
    found = generate_mutants(graph, seed=0)
    kinds = found.kinds()
    for kind in ("imap", "fmap", "omap", "off-by-one"):
        assert kinds.get(kind, 0) > 0, kinds
    _assert_all_killed(graph, found, 1.0)


# ---- the rewrite utilities -----------------------------------------------------------------------
def test_rewrite_replaces_one_node_and_rebuilds_downstream():
    x, y = ir.input("X", (4, 8), "float32"), ir.input("Y", (4, 8), "float32")
    s = x + y
    graph = ir.KernelGraph([s.exp() * 2.0], [x, y])
    assert rewrite(graph, {}) is graph
    mutated = rewrite(graph, {s: x - y})
    assert mutated.outputs[0] is ((x - y).exp() * 2.0)
    assert mutated.inputs == graph.inputs


def test_rewrite_block_drops_and_renumbers_unused_inputs():
    w, reference = _reference("lora")
    (bg, srcs), = reference.custom_ops()
    total = bg.outputs[0].node                      # (x @ w).acc_sum() + (x @ a).acc_sum() @ bb
    first = total.srcs[0]
    new, kept = rewrite_block(bg, {total: first})
    assert kept == (0, 1) and len(new.inputs) == 2
    graph = replace_block(reference, bg, new, kept)
    (bg2, srcs2), = graph.custom_ops()
    assert bg2 is new and srcs2 == srcs[:2]
