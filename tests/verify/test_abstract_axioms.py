"""Every axiom is true of real arithmetic, the predicate facts cover every function, and Z3 proves the core laws."""
from __future__ import annotations

import numpy as np
import pytest
import z3

from mugraph.verify.abstract import axioms as A
from mugraph.verify.abstract import expr as E
from mugraph.verify.abstract.axioms import LAWS
from mugraph.verify.abstract.expr import Fn

INSTANCES = 200


@pytest.mark.parametrize("law", LAWS, ids=[law.name for law in LAWS])
def test_every_law_is_sound_on_random_floats(law):
    """Both sides of every law agree on random values (sums over random vectors of the sizes)."""
    rng = np.random.default_rng(0)
    for _ in range(INSTANCES):
        lhs, rhs = law.check(rng)
        assert np.allclose(lhs, rhs, rtol=1e-9, atol=1e-12, equal_nan=True), (law.name, lhs, rhs)


def test_every_law_has_axioms_with_patterns():
    for law in LAWS:
        assert law.axioms, law.name
        for q in law.axioms:
            assert z3.is_quantifier(q) and q.num_patterns() >= 1, law.name


def test_index_forgetting_laws_are_marked():
    """sum(n, x*y) = sum(n, x)*y holds only for y free of the summed index; its check tests that law."""
    assert {law.name for law in LAWS if law.abstraction} == {"sum-mul"}


def test_every_function_has_its_argument_facts():
    """Mirage's predicate: each argument is a subexpression of the term built from it."""
    qids = {q.qid() for q in A.axioms()}
    for f in (A.add, A.mul, A.inv, A.exp, A.rsum, A.maxr, A.vmax, A.vmin, A.power, A.concat, A.sqrt):
        assert f"sub-args-{f.name()}" in qids
    tanh = A.opaque(Fn.TANH, (), 1)
    assert f"sub-args-{tanh.name()}" in {q.qid() for q in A.axioms()}


def test_erasing_laws_stay_out_of_the_subexpression_theory():
    """With 0*x = 0, x = x + 0*c would make every c a subexpression of every x."""
    assert A.ERASING >= {"mul-zero/0", "pow-zero/0"}
    assert not {q.qid() for q in A.axioms(erasing=False)} & A.ERASING
    x, y, z = (E.var(n) for n in "xyz")
    spec = [E.maximum(z, x - x) * y]
    assert not A.z3_subexpression(E.inv(E.maximum(z, y)), [z], 200_000)
    assert not A.z3_subexpression(E.exp(x), spec, 200_000)


CORE = {
    "distribute": lambda x, y, z: (x * (y + z), z * x + y * x),
    "sum-merge": lambda x, y, z: (E.reduce_sum(3, E.reduce_sum(4, x)), E.reduce_sum(12, x)),
    "sum-mul": lambda x, y, z: (E.reduce_sum(4, x * y) * z, E.reduce_sum(4, x * z) * y),
    "division": lambda x, y, z: (x / z + y / z, (x + y) / z),
    "div-div": lambda x, y, z: ((x / y) / z, x / (y * z)),
    "exp-split": lambda x, y, z: (E.exp(x - y), E.exp(x) / E.exp(y)),
    "online-softmax": lambda x, y, z: (
        E.reduce_sum(4, E.exp(x - y)), E.reduce_sum(4, E.exp(x)) * E.inv(E.exp(y))),
    "maxr-merge": lambda x, y, z: (E.reduce_max(2, E.reduce_max(8, x)), E.reduce_max(16, x)),
    "max-ac": lambda x, y, z: (E.maximum(E.maximum(x, y), z), E.maximum(z, E.maximum(y, x))),
    "constants": lambda x, y, z: (E.const(0.5) * (x + x), x),
}


@pytest.mark.parametrize("name", sorted(CORE))
def test_z3_proves_the_core_laws(name):
    lhs, rhs = CORE[name](*(E.var(n) for n in "xyz"))
    assert A.z3_equal(lhs, rhs, 400_000)


def test_z3_does_not_prove_false_equations():
    x, y, z = (E.var(n) for n in "xyz")
    for lhs, rhs in [(x + y, x * y), (E.exp(x + y), E.exp(x) + E.exp(y)),
                     (E.reduce_sum(4, x), E.reduce_sum(8, x)), (E.reduce_max(4, x + y), x + y)]:
        assert not A.z3_equal(lhs, rhs, 100_000)


def test_subexpression_lemma_splits_reductions():
    x, w, r = (E.var(n) for n in "xwr")
    spec = [E.reduce_sum(64, x * w * r)]
    assert A.z3_subexpression(E.reduce_sum(16, x * w), spec, 400_000)
    assert not A.z3_subexpression(E.reduce_sum(3, x * w), spec, 100_000)


def test_queries_are_deterministic():
    """Each query runs in a fresh context, so earlier queries cannot change an answer."""
    x, y = E.var("x"), E.var("y")
    goal = (E.reduce_sum(4, x * y) * E.exp(x - y), E.reduce_sum(4, x * E.exp(x)) * y / E.exp(y))
    first = A.z3_equal(*goal, 150_000)
    for other in [(x, y), (x * y, y * x), (E.exp(x), E.exp(y))]:
        A.z3_equal(*other, 100_000)
    assert A.z3_equal(*goal, 150_000) == first
