"""Split-K / split-KV structures: a loop kernel becomes a partials kernel and a combine kernel
(FlashDecoding), verified like any candidate, and the search ranks them with the rest."""
from __future__ import annotations

import pytest

from mugraph import ir, workloads
from mugraph.ir.ops import BOp
from mugraph.search import SearchConfig, search
from mugraph.search.split import split_kernel, split_structures
from mugraph.verify import check

QUIET = dict(progress=lambda *a: None)


def _one_kernel_attention(spec, online: bool):
    """Attention as one kernel: a block per (batch, 64 query rows), the loop over the keys."""
    Q, K, V = spec.inputs
    b = ir.BlockBuilder(grid=(Q.shape[0], Q.shape[1] // 64, 1), forloop=K.shape[2] // 64)
    q = b.input(Q, imap=(0, 1), fmap=None)
    k = b.input(K, imap=(0, None), fmap=2)
    v = b.input(V, imap=(0, None), fmap=1)
    s = q @ k
    if online:
        m = s.acc_max_last()
        e = (s - m).exp()
        out = (e @ v).acc_sum_rescale(m) / e.acc_sum_last_rescale(m)
    else:
        e = s.exp()
        out = (e @ v).acc_sum() / e.acc_sum_last()
    return ir.KernelGraph(b.finish([(out, (0, 1))]), [Q, K, V])


@pytest.mark.parametrize("name, online", [("gqa", False), ("gqa_safe", True)])
def test_attention_splits_into_partials_and_a_combine(name, online):
    spec = workloads.get(name).small().spec()
    whole = _one_kernel_attention(spec, online)
    assert check(spec, whole, seed=0).equivalent
    (split,) = split_structures(whole, max_kernel_ops=2, max_custom_ops=2)
    (k1, _), (k2, _) = split.custom_ops()
    assert k1.grid[2] == 2 and k1.forloop == whole.custom_ops()[0][0].forloop
    assert k2.forloop == 2 and all(o.dtype is ir.DType.FLOAT32 for o in k1.outputs)
    combine = [n.op for n in k2.nodes]
    assert combine.count(BOp.ACC_SUM_RESCALE if online else BOp.ACC_SUM) == 2
    if online:
        assert BOp.ACC_MAX in combine and len(k1.outputs) == 3     # partial o, l and max
    assert check(spec, split, seed=0).equivalent


def test_a_split_is_only_made_within_the_config_limits_and_for_combinable_loops():
    spec = workloads.get("gqa").small().spec()
    whole = _one_kernel_attention(spec, online=False)
    assert split_structures(whole, max_kernel_ops=1, max_custom_ops=3) == []
    assert split_structures(whole, max_kernel_ops=3, max_custom_ops=1) == []
    X = ir.input("X", (16, 256), "float16")
    b = ir.BlockBuilder(grid=(1, 1, 1), forloop=4)
    x = b.input(X, imap=None, fmap=1)
    rms = ir.KernelGraph(b.finish([(x.acc_rms_last(), (None,))]), [X])
    assert split_kernel(rms.custom_ops()[0][0], 2) is None       # a root of a sum: no partials


def test_the_search_derives_verified_splits_and_ranks_them():
    spec = workloads.get("gqa").small().spec()
    config = SearchConfig(max_kernel_ops=2, max_block_ops=6, budget_states=1000, budget_seconds=120)
    result = search(spec, config, **QUIET)
    assert result.report.split > 0
    two = [c for c in result.candidates if len(c.graph.custom_ops()) == 2]
    assert two, [c.structure for c in result.candidates]
    assert [c.seconds for c in result.candidates] == sorted(c.seconds for c in result.candidates)
    assert check(spec, two[0].graph, seed=0).equivalent
