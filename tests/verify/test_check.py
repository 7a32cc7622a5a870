"""`check` and `quick_equivalent`: every workload's hand-written fused μGraph verifies against its
JAX spec, interfaces are compared first, and the report says what each method found."""
from __future__ import annotations

import pytest

from mugraph import ir, workloads
from mugraph.verify import VerificationReport, check, finite_field_test, quick_equivalent
from mugraph.verify.abstract import prove_equivalent


def _small(name):
    w = workloads.get(name).small()
    return w, w.spec(), w.reference()


@pytest.mark.parametrize("name", workloads.names())
def test_every_reference_verifies_against_its_spec(name):
    w, spec, reference = _small(name)
    report = check(spec, reference, seed=0, scale=w.input_scale)
    assert report.equivalent and report.verdict == "EQUIVALENT", str(report)
    assert report.finite_field.established and report.error_bound <= 2.0 ** -40
    assert report.error_bound == report.finite_field.error_bound
    assert report.float.passed
    statuses = {m.name: m.status for m in report.methods}
    assert statuses["finite field"] == statuses["float64"] == statuses["own precision"] == "passed"
    proof = prove_equivalent(spec, reference)
    assert report.formal_status == statuses["formal"] == ("proved" if proof.proved else "not proved")
    assert quick_equivalent(spec, reference)


@pytest.mark.slow
@pytest.mark.parametrize("name", workloads.names())
def test_every_reference_verifies_at_full_shape(name):
    # every method at the real shapes, every element compared (bench/verify.py times it)
    w = workloads.get(name)
    report = check(w.spec(), w.reference(), seed=0, scale=w.input_scale, formal=False)
    assert report.equivalent and report.finite_field.sampled is None, str(report)
    assert report.finite_field.established and report.error_bound <= 2.0 ** -40
    assert report.float.reference == "jax.jit(fn)" and report.float.special_cases


@pytest.mark.slow
def test_a_sampled_field_test_at_full_shape_says_what_it_covers():
    w = workloads.get("gqa_safe")
    result = finite_field_test(w.spec(), w.reference(), seed=0, tests=1, sample_blocks=1)
    assert result.passed and "the bound covers those elements only" in result.sampled


def test_the_report_reads_as_a_summary():
    w, spec, reference = _small("rmsnorm_linear")
    report = check(spec, reference, seed=1, scale=w.input_scale)
    text = str(report)
    first = text.splitlines()[0]
    assert first.startswith("EQUIVALENT: finite field passed (bound 2^-")
    for method in ("; float64 passed (", "; own precision passed (", "; special values ",
                   "; formal "):
        assert method in first, first
    for part in ("seed 1", "finite field: passed", "error bound: 2^-", "(target 2^-40)"):
        assert part in text


def test_a_wrong_candidate_is_rejected_by_the_field_test_first():
    w, spec, reference = _small("gated_mlp")
    x, w1, w2 = spec.inputs
    wrong = ir.KernelGraph([(x @ w1).silu() * (x @ w1)], spec.inputs)
    report = check(spec, wrong, seed=2, scale=w.input_scale, formal=False)
    assert not report.equivalent and report.reason.startswith("finite-field test failed")
    assert report.verdict == "NOT EQUIVALENT" and report.error_bound == 1.0
    assert "output 0 differs" in report.reason and report.formal_status == "skipped"
    assert {m.name: m.status for m in report.methods}["formal"] == "skipped"
    assert not quick_equivalent(spec, wrong)


def test_a_numerically_unsafe_candidate_is_rejected_by_the_float_test():
    # softmax without its max shift equals the safe one exactly: only the float test sees it
    safe = workloads.get("gqa_safe").small().spec()
    unsafe = workloads.get("gqa").small().reference()
    assert quick_equivalent(safe, unsafe)
    report = check(safe, unsafe, seed=3, scale=4.0, formal=False)
    assert report.finite_field.passed and not report.float.passed and not report.equivalent
    assert report.reason.startswith("float differential test failed: ")


def test_mismatched_interfaces_are_a_verdict_not_an_exception():
    x, y = ir.input("X", (4, 8), "float16"), ir.input("Y", (4, 8), "float16")
    z = ir.input("Z", (4, 8), "float16")
    cases = [
        (ir.KernelGraph([x + y]), ir.KernelGraph([x + z]), "inputs differ"),
        (ir.KernelGraph([x + y]), ir.KernelGraph([x + y, x]), "outputs"),
        (ir.KernelGraph([x + y]), ir.KernelGraph([(x + y).sum(1)]), "output 0 is f16[4, 8]"),
        (ir.KernelGraph([x]), ir.KernelGraph([ir.input("X", (4, 8), "float32")]), "input 'X'"),
    ]
    for spec, cand, reason in cases:
        report = check(spec, cand, seed=0)
        assert isinstance(report, VerificationReport) and not report.equivalent
        assert reason in report.reason and report.finite_field is None
        assert all(m.status == "skipped" for m in report.methods) and len(report.methods) == 5
        assert not quick_equivalent(spec, cand)


def test_inputs_are_matched_by_name_not_position():
    x, y = ir.input("X", (4, 8), "float32"), ir.input("Y", (4, 8), "float32")
    assert check(ir.KernelGraph([x - y], [x, y]), ir.KernelGraph([x - y], [y, x]), seed=0,
                 formal=False).equivalent


def test_an_untestable_candidate_is_rejected_with_the_reason():
    x = ir.input("X", (4, 8), "float32")
    report = check(ir.KernelGraph([x]), ir.KernelGraph([x * (x / (x - x))]), seed=0, formal=False)
    assert not report.equivalent and "zero divisor" in report.reason
    assert not quick_equivalent(ir.KernelGraph([x]), ir.KernelGraph([x * (x / (x - x))]))


def test_a_difference_only_the_field_test_sees_is_not_established_not_not_equivalent():
    # equal over the reals; the finite field keeps no law for sigmoid, so it cannot tell
    x = ir.input("X", (4, 8), "float32")
    report = check(ir.KernelGraph([x.sigmoid()]), ir.KernelGraph([1.0 / (1.0 + (-x).exp())]),
                   seed=0, formal=False)
    assert report.finite_field.failure and report.float.passed
    assert report.verdict == "NOT ESTABLISHED" and "does not keep" in report.reason


def test_seed_is_recorded_and_makes_runs_reproducible():
    w, spec, reference = _small("lora")
    first = check(spec, reference, formal=False, scale=w.input_scale)
    again = check(spec, reference, seed=first.seed, formal=False, scale=w.input_scale)
    assert first.finite_field.primes == again.finite_field.primes


def test_explicit_test_count_and_bound():
    w, spec, reference = _small("ntrans")
    report = check(spec, reference, tests=5, seed=0, formal=False)
    ff = report.finite_field
    assert ff.tests == 5 and ff.error_bound < 2.0 ** -100 and report.error_bound == ff.error_bound


def test_a_bound_above_the_target_is_not_established_never_equivalent():
    # one test of attention over 512 keys: the exp-collision term is about 2^-29
    w, spec, reference = _small("gqa")
    report = check(spec, reference, tests=1, seed=0, formal=False, scale=w.input_scale)
    assert report.finite_field.passed and report.float.passed
    assert report.verdict == "NOT ESTABLISHED" and not report.equivalent
    assert report.reason.startswith("finite-field bound not established")
    assert "finite field not established (bound 2^-" in report.verdict_line()


def test_a_degree_beyond_the_field_is_not_established():
    x = ir.input("X", (1, 4), "float32")
    huge = ir.KernelGraph([x ** float(2 ** 51)])
    report = check(huge, huge, seed=0, formal=False, scale=0.5)
    assert report.finite_field.passed and report.finite_field.error_bound == 1.0
    assert report.verdict == "NOT ESTABLISHED" and not report.equivalent


def _huge(x):
    return (x + x).exp() + (x * 0.5) ** float(2 ** 51)   # degree 2^51: beyond any field


def _high(x):
    return (x * 0.5) ** float(2 ** 20)                   # degree 2^20: one test bounds 2^-29


CASES = {"equivalent": ("EQUIVALENT", lambda x: (x + x).exp(), lambda x: x.exp() ** 2.0, None),
         "one test": ("NOT ESTABLISHED", _high, _high, 1),
         "two tests": ("EQUIVALENT", _high, _high, 2),
         "huge degree": ("NOT ESTABLISHED", _huge, _huge, None),
         "wrong": ("NOT EQUIVALENT", lambda x: (x + x).exp(), lambda x: (x * x).exp(), None)}


@pytest.mark.parametrize("case", list(CASES))
def test_equivalent_always_means_the_bound_was_met(case):
    x = ir.input("X", (2, 4), "float32")
    verdict, spec, candidate, tests = CASES[case]
    report = check(ir.KernelGraph([spec(x)]), ir.KernelGraph([candidate(x)]), tests=tests,
                   seed=3, formal=False, scale=0.5)
    assert report.verdict == verdict, str(report)
    assert report.equivalent == (verdict == "EQUIVALENT")
    if report.equivalent:
        assert report.finite_field.established and report.error_bound <= report.target


def test_shapes_other_than_given_are_refused():
    x = ir.input("X", (4, 8), "float32")
    with pytest.raises(ir.InvalidInput, match="shapes"):
        check(ir.KernelGraph([x]), ir.KernelGraph([x]), shapes="small")


def test_require_proof_lets_the_formal_result_veto():
    w, spec, reference = _small("lora")
    report = check(spec, reference, seed=0, scale=w.input_scale, require_proof=True)
    proved = prove_equivalent(spec, reference).proved
    assert report.equivalent == proved
    assert report.verdict == ("EQUIVALENT" if proved else "NOT ESTABLISHED")
