"""Casts are roundings: a candidate may round only where the program holds the same value in the
same 16-bit dtype (a cast of it, an input, a stored 16-bit tensor); any other cast is a new
rounding — uninterpreted in the finite field and in the formal check, rounded in float64 mode."""
from __future__ import annotations

from mugraph import ir, workloads
from mugraph.verify import check, finite_field_test, float_diff, pair_bound
from mugraph.verify.abstract import prove_equivalent
from mugraph.verify.abstract.casts import new_roundings, program_roundings


def _norm(x):
    return x * (x * x).sum(1).rsqrt()


def _graphs():
    x = ir.input("X", (8, 64), "float32")
    w = ir.input("W", (64, 16), "float16")
    spec = ir.KernelGraph([_norm(x).cast("float16") @ w])
    same = ir.KernelGraph([(_norm(x) * 1.0).cast("float16") @ w])       # the same value rounded
    other = ir.KernelGraph([(_norm(x) * 0.5).cast("float16") @ (w * 2.0)])  # another value rounded
    skipped = ir.KernelGraph([(_norm(x) @ w.cast("float32")).cast("float16")])
    return spec, same, other, skipped


def test_the_finite_field_keeps_the_programs_roundings_and_no_other():
    spec, same, other, skipped = _graphs()
    assert finite_field_test(spec, same, seed=0).passed
    assert not finite_field_test(spec, other, seed=0).passed     # x*0.5 is not what it rounds
    # the output is an fp16 tensor of the spec: a cast of that value is the program's rounding
    assert finite_field_test(spec, skipped, seed=0).passed


def test_a_cast_to_fp32_or_of_a_16bit_input_to_its_own_dtype_rounds_nothing():
    x = ir.input("X", (4, 8), "float16")
    spec = ir.KernelGraph([x * 2.0])
    round_trip = ir.KernelGraph([x.cast("float32").cast("float16") * 2.0])
    assert finite_field_test(spec, round_trip, seed=0).passed
    assert check(spec, round_trip, seed=0).equivalent
    to_bf16 = ir.KernelGraph([x.cast("bfloat16").cast("float16") * 2.0])
    assert not finite_field_test(spec, to_bf16, seed=0).passed   # bf16 keeps 8 bits of 11


def test_the_formal_check_reads_a_new_rounding_as_an_uninterpreted_function():
    spec, same, other, skipped = _graphs()
    assert not new_roundings(spec, same) and not new_roundings(spec, skipped)
    assert len(new_roundings(spec, other)) == 1
    assert prove_equivalent(spec, same).proved and prove_equivalent(spec, skipped).proved
    assert not prove_equivalent(spec, other).proved
    assert len(program_roundings(spec)) >= 2     # the cast's operand, and W (an fp16 input)


def test_float64_mode_rounds_at_casts():
    x = ir.input("X", (4, 8), "float32")
    spec = ir.KernelGraph([x * 3.0])
    rounds = ir.KernelGraph([x.cast("float16").cast("float32") * 3.0])
    result = float_diff(spec, rounds, seed=0, modes=("float64",), cases=("random",))
    assert not result.passed and result.mode("float64").worst.error > 1e-6
    report = check(spec, rounds, seed=0)
    assert not report.equivalent and report.verdict == "NOT EQUIVALENT"


def test_a_kernel_that_skips_a_programs_rounding_is_not_held_to_it():
    """The spec stores a row sum in fp16; a kernel that keeps it in fp32 is the more precise:
    the rounding budget allows it in float64 mode and in its own precision."""
    x = ir.input("X", (4, 64), "float16")
    e = x.exp()
    spec = ir.KernelGraph([e / e.cast("float32").sum(1).cast("float16")])
    fused = ir.KernelGraph([(e.cast("float32") / e.cast("float32").sum(1)).cast("float16")])
    report = check(spec, fused, seed=0)
    assert report.equivalent, str(report)


def test_the_bound_and_the_sampled_test_handle_casts():
    spec, same, other, _ = _graphs()
    assert pair_bound(spec, same).degree >= 1
    assert finite_field_test(spec, same, seed=1, sample_blocks=1).passed
    assert not finite_field_test(spec, other, seed=1, sample_blocks=1).passed


def test_a_block_level_rounding_before_an_mma_is_the_programs_own():
    """qknorm_gqa rounds the normalised Q and K to fp16 before Q @ K, as the program does."""
    w = workloads.get("qknorm_gqa").small()
    spec, reference = w.spec(), w.reference()
    assert not new_roundings(spec, reference)
    assert finite_field_test(spec, reference, seed=0).passed


def _rounding_pools(bound) -> set:
    return {pool for pool, _, _ in bound.collisions if isinstance(pool, tuple) and pool[0] == "round"}


def test_the_bound_counts_new_roundings_of_the_candidate_and_never_the_specs_casts():
    spec, same, other, _ = _graphs()
    assert not _rounding_pools(pair_bound(spec, spec))                      # the spec's own
    assert not _rounding_pools(pair_bound(spec, same, trust_forms=True))    # held by form
    assert _rounding_pools(pair_bound(spec, other, trust_forms=True))       # a new rounding
    assert _rounding_pools(pair_bound(spec, same))      # not trusting forms, every cast counts
