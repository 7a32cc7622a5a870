"""The search report says why structures were rejected: counts by reason (the first failing
method), each with an example element; and what 'exhausted' means when pruning cut subtrees."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from mugraph import ir
from mugraph.search import SearchConfig
from mugraph.search.cost import estimate
from mugraph.search.result import Candidate, Rejections, SearchReport, _rejection_lines
from mugraph.search.runner import REAL, _check_ranked


def _pair():
    args = [jax.ShapeDtypeStruct((8, 16), jnp.float32)] * 2
    spec = ir.from_jax(lambda x, y: jnp.concatenate([x + 1e5, y]), *args)
    underflows = ir.from_jax(lambda x, y: jnp.concatenate(
        [x + 1e5, y * 2.0**-78 * 2.0**-78 * 2.0**78 * 2.0**78]), *args)
    wrong = [ir.from_jax(lambda x, y, k=k: jnp.concatenate([x + 1e5, y * k]), *args)
             for k in (2.0, 3.0)]
    return spec, underflows, wrong


def _candidate(graph, origin="search"):
    return Candidate(graph, estimate(graph, "h100"), "test", origin)


def test_rejections_at_the_real_shapes_are_counted_by_reason_with_an_example():
    spec, underflows, wrong = _pair()
    ranked = [_candidate(wrong[0]), _candidate(underflows), _candidate(wrong[1]),
              _candidate(spec, "spec")]
    rejections = Rejections()
    checked = _check_ranked(spec, ranked, SearchConfig(), float("inf"), rejections)
    assert checked.rejected == 3 and checked.ranked[0].graph is spec
    rows = {why: (where, count, example) for where, why, count, example in rejections.rows()}
    assert set(rows) == {"finite field: outputs differ", "own precision failed"}
    where, count, example = rows["finite field: outputs differ"]
    assert where == REAL and count == 2 and "differs at" in example
    where, count, example = rows["own precision failed"]
    assert count == 1 and "random case: relative error 1 " in example and "candidate 0.0" in example
    text = "\n".join(_rejection_lines(rejections.rows()))
    assert "rejected at the real shapes: 3, by reason:" in text
    assert "2 finite field: outputs differ; e.g. test 0" in text


def _report(pruned, stop="exhausted"):
    return SearchReport(stop, 10, 1, pruned, 1, 1, 0, 1.0, 1.0, (), {}, "h100", None, None)


def test_exhausted_says_whole_space_only_where_no_expression_pruning_cut_a_subtree():
    assert "the whole space at the config's limits was visited" in _report({"shape": 3}).stop_meaning()
    cut = _report({"expression": 7}).stop_meaning()
    assert "visiting what the pruning rules admit" in cut and "cut 7 subtrees" in cut
    assert "the whole space" not in cut.replace("the whole space was not visited", "")
    assert "not exhausted" in _report({"expression": 7}, "time").stop_meaning()
