"""`check` and `quick_equivalent`: every workload's hand-written fused μGraph verifies against its
JAX spec, interfaces are compared first, and the report says what each method found."""
from __future__ import annotations

import pytest

from mugraph import ir, workloads
from mugraph.verify import VerificationReport, check, quick_equivalent


def _small(name):
    w = workloads.get(name).small()
    return w, w.spec(), w.reference()


@pytest.mark.parametrize("name", workloads.names())
def test_every_reference_verifies_against_its_spec(name):
    w, spec, reference = _small(name)
    report = check(spec, reference, seed=0, scale=w.input_scale)
    assert report.equivalent, str(report)
    assert report.error_bound <= 2.0 ** -40
    assert report.finite_field.passed and report.finite_field.tests >= 3
    assert report.float.passed
    assert report.formal_status in ("proved", "not proved") or \
        report.formal_status.startswith("unavailable")
    assert quick_equivalent(spec, reference)


@pytest.mark.slow
@pytest.mark.parametrize("name", workloads.names())
def test_every_reference_verifies_at_full_shape(name):
    w = workloads.get(name)
    report = check(w.spec(), w.reference(), seed=0, scale=w.input_scale)
    assert report.equivalent, str(report)


def test_the_report_reads_as_a_summary():
    w, spec, reference = _small("rmsnorm_linear")
    text = str(check(spec, reference, seed=1, scale=w.input_scale))
    for part in ("EQUIVALENT (seed 1", "finite field: passed", "float float64: ok",
                 "float own: ok", "formal:", "error bound:"):
        assert part in text


def test_a_wrong_candidate_is_rejected_by_the_field_test_first():
    w, spec, reference = _small("gated_mlp")
    x, w1, w2 = spec.inputs
    wrong = ir.KernelGraph([(x @ w1).silu() * (x @ w1)], spec.inputs)
    report = check(spec, wrong, seed=2, scale=w.input_scale, formal=False)
    assert not report.equivalent and report.reason.startswith("finite-field test failed")
    assert "output 0 differs" in report.reason and report.formal_status == "skipped"
    assert not quick_equivalent(spec, wrong)


def test_a_numerically_unsafe_candidate_is_rejected_by_the_float_test():
    # softmax without its max shift equals the safe one exactly: only the float test sees it
    safe = workloads.get("gqa_safe").small().spec()
    unsafe = workloads.get("gqa").small().reference()
    assert quick_equivalent(safe, unsafe)
    report = check(safe, unsafe, seed=3, scale=4.0, formal=False)
    assert report.finite_field.passed and not report.float.passed and not report.equivalent
    assert report.reason.startswith("float differential test failed")


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


def test_shapes_other_than_given_are_refused():
    x = ir.input("X", (4, 8), "float32")
    with pytest.raises(ir.InvalidInput, match="shapes"):
        check(ir.KernelGraph([x]), ir.KernelGraph([x]), shapes="small")


def test_require_proof_lets_the_formal_result_veto():
    w, spec, reference = _small("lora")
    report = check(spec, reference, seed=0, scale=w.input_scale, require_proof=True)
    assert report.equivalent == (report.formal_status == "proved")
