"""Mutation testing: for every workload, valid one-change mutants of the hand-written fused μGraph
(schedule maps, accumulators, operands, ops, constants), classified by an oracle that shares no
inputs with the methods under test. The finite-field test alone kills every mutant the oracle
separates, `check` rejects them all and accepts the original, and the formal proof never proves
one. Kill rates are tests, not figures; `bench/verify.py` prints every method's."""
from __future__ import annotations

import numpy as np
import pytest

from mugraph import ir, workloads
from mugraph.verify import check, finite_field_test, generate_mutants, rewrite
from mugraph.verify.abstract import prove_equivalent
from mugraph.verify.float_diff import random_inputs
from mugraph.verify.mutate import (EQUIVALENT, SEPARATED, UNDECIDED, Oracle, _kernel_edits,
                                   kill_rates, oracle_inputs, replace_block, rewrite_block)

MIN_MUTANTS = 20
LIMIT = 30          # per workload (seeded order)
CHECK_LIMIT = 10    # the whole check per mutant costs more
KINDS = {"imap", "fmap", "omap", "off-by-one", "accumulator", "swap", "drop", "duplicate",
         "constant", "wrong-op", "wrong-operand"}


def _reference(name):
    w = workloads.get(name).small()
    return w, w.reference()


@pytest.mark.parametrize("name", workloads.names())
def test_the_field_test_alone_kills_every_separated_mutant(name):
    w, reference = _reference(name)
    found = generate_mutants(reference, seed=1, limit=LIMIT, scale=w.input_scale)
    assert len(found.mutants) >= MIN_MUTANTS, found
    survivors = [m.description for m in found.mutants
                 if finite_field_test(reference, m.graph, seed=1).passed]
    assert not survivors, f"the finite-field test passed {len(survivors)} mutants: {survivors}"


@pytest.mark.parametrize("name", workloads.names())
def test_check_rejects_every_separated_mutant_and_accepts_the_original(name):
    w, reference = _reference(name)
    assert check(w.spec(), reference, seed=0, scale=w.input_scale, formal=False).equivalent
    found = generate_mutants(reference, seed=0, limit=CHECK_LIMIT, scale=w.input_scale)
    survivors = [m.description for m in found.mutants
                 if check(reference, m.graph, seed=0, scale=w.input_scale, formal=False).equivalent]
    assert not survivors, f"check accepted {len(survivors)} mutants: {survivors}"


@pytest.mark.parametrize("name", workloads.names())
def test_the_formal_proof_never_proves_a_separated_mutant(name):
    w, reference = _reference(name)
    found = generate_mutants(reference, seed=2, limit=LIMIT, scale=w.input_scale)
    proved = [m.description for m in found.mutants if prove_equivalent(reference, m.graph).proved]
    assert not proved, f"'proved' for {len(proved)} mutants the oracle separates: {proved}"


def test_each_method_is_graded_alone():
    w, reference = _reference("lora")
    found = generate_mutants(reference, seed=3, limit=12, scale=w.input_scale)
    rates = kill_rates(reference, found.mutants, seed=3, scale=w.input_scale)
    assert rates.total == len(found.mutants) >= 10
    assert set(rates.killed) == {"finite field", "float64", "own precision", "special values",
                                 "formal", "check"}
    assert rates.rate("finite field") == rates.rate("check") == 1.0
    assert rates.rate("formal") == 1.0          # never proved: what `formal` achieves here
    assert "finite field: 12/12 (100%)" in rates.line("finite field") or rates.total != 12


# ---- the oracle ---------------------------------------------------------------------------------
def test_the_oracle_shares_no_inputs_with_the_float_test():
    w, reference = _reference("gated_mlp")
    for seed in (0, 1):
        floats = random_inputs(reference, seed=seed, scale=w.input_scale)
        for draw in (0, 1):
            ours = oracle_inputs(reference, seed, draw, w.input_scale)
            assert all(not np.allclose(ours[k], floats[k]) for k in ours)
    first, second = (oracle_inputs(reference, 0, d, 1.0)["X"] for d in (0, 1))
    assert np.abs(first).max() > 1.5 and np.abs(second).max() < 0.7   # two scales


def test_the_oracle_tells_separated_equivalent_and_undecided_apart():
    x = ir.input("X", (4, 8), "float32")
    oracle = Oracle(ir.KernelGraph([x + x]), seed=0, scale=1.0)
    assert oracle.classify(ir.KernelGraph([x * 2.0]))[0] == EQUIVALENT
    assert oracle.classify(ir.KernelGraph([x * 2.0 + 1e-3]))[0] == SEPARATED
    assert oracle.classify(ir.KernelGraph([(x + x).relu()]))[0] == SEPARATED
    # differs only where x > 1.8: at the first draw (±2), never at the second (±2/3)
    assert oracle.classify(ir.KernelGraph([x + x + (x - 1.8).relu()]))[0] == UNDECIDED


def test_the_mutants_cover_every_kind_across_the_suite():
    kinds = set()
    for name in workloads.names():
        w, reference = _reference(name)
        kinds |= set(generate_mutants(reference, scale=w.input_scale).kinds())
    assert KINDS <= kinds, f"missing kinds {KINDS - kinds}"


def _every_valid_mutant(reference) -> set:
    """Every edit the generator tries, built here: the valid, distinct mutants (no oracle)."""
    found = set()
    for _, _, make in _kernel_edits(reference):
        try:
            mutant = make()
        except ir.InvalidGraph:
            continue
        if [(o.shape, o.dtype) for o in mutant.outputs] == \
                [(o.shape, o.dtype) for o in reference.outputs] and mutant is not reference:
            found.add(mutant)
    return found


def test_equivalent_mutants_are_discarded_and_counted():
    """The generator's oracle (float64 on its own inputs) keeps the separated mutants and counts
    the equivalent ones; judged here by the exact finite-field test instead: every kept mutant
    differs from the reference, and at least as many discarded ones compute its function as the
    oracle counted equivalent (an oracle that discarded a real mutant as equivalent fails)."""
    # ntrans's block has forloop 1 and no looped input: other trip counts of its schedule, and
    # other mutations, include some that compute the same function
    w, reference = _reference("ntrans")
    found = generate_mutants(reference, scale=w.input_scale)
    kept = {m.graph for m in found.mutants}
    every = _every_valid_mutant(reference)
    discarded = every - kept
    assert kept <= every and len(kept) == len(found.mutants)
    assert len(discarded) == found.equivalent + found.undecided
    assert found.equivalent > 0 and found.invalid > 0
    differs = [g for g in kept if finite_field_test(reference, g, seed=5).passed]
    assert not differs, f"{len(differs)} kept mutants compute the reference's function"
    same = sum(finite_field_test(reference, g, seed=5).passed for g in discarded)
    assert same >= found.equivalent, (same, found.equivalent)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["lora", "ntrans"])
def test_the_field_test_kills_mutants_at_full_shape(name):
    w = workloads.get(name)
    reference = w.reference()
    found = generate_mutants(reference, seed=3, limit=8, scale=w.input_scale)
    assert len(found.mutants) >= 8
    survivors = [m.description for m in found.mutants
                 if finite_field_test(reference, m.graph, seed=3, tests=1).passed]
    assert not survivors


def test_spec_level_mutants_are_killed_by_the_field_test_alone():
    for name in ("rmsnorm_linear", "gqa_safe", "ntrans"):
        w = workloads.get(name).small()
        spec = w.spec()
        found = generate_mutants(spec, seed=0, limit=25, scale=w.input_scale)
        assert len(found.mutants) >= 15
        assert not [m.description for m in found.mutants
                    if finite_field_test(spec, m.graph, seed=0).passed]


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
    assert not [m.description for m in found.mutants
                if finite_field_test(graph, m.graph, seed=0).passed]


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
