"""Thread chains: elementwise ops fused into their producer's register epilogue."""
from __future__ import annotations

from collections import Counter

import pytest

from mugraph import ir
from mugraph.ir import BOp
from tests.ir.samples import all_samples
from tests.ir.test_printer import rmsnorm_matmul


def test_rmsnorm_epilogue_is_one_chain():
    bg = rmsnorm_matmul().outputs[0].arg[0]
    chains = {c.leader.op: c for c in ir.thread_chains([o.node for o in bg.outputs])}
    norm = chains[BOp.ACC_SUM_LAST]
    assert [n.op.value for n in norm.ops] == ["div", "add", "rsqrt"]
    assert norm.tail.op is ir.TOp.RSQRT
    assert chains[BOp.MATMUL].ops == ()  # read by the accumulator: not an elementwise link


@pytest.mark.parametrize("op,level,graph", [s for s in all_samples() if s[1] == "block"],
                         ids=lambda v: getattr(v, "value", None))
def test_chains_partition_the_non_constant_nodes(op, level, graph):
    bg = graph.outputs[0].arg[0]
    outputs = [o.node for o in bg.outputs]
    chains = ir.thread_chains(outputs)
    members = Counter(n for c in chains for n in (c.leader, *c.ops))
    scalar = {n for n in bg.nodes if n.op is BOp.CONSTANT and set(n.shape) == {1}}
    assert set(members) == set(bg.nodes) - scalar and max(members.values()) == 1
    uses = Counter(s for n in bg.nodes for s in set(n.srcs)) + Counter(outputs)
    for c in chains:
        for prev, link in zip((c.leader, *c.ops), c.ops):
            assert isinstance(link.op, ir.TOp) and prev in link.srcs
            assert uses[prev] == 1 and link.shape == prev.shape
