"""Golden files of generated CUDA (regenerate with MUGRAPH_UPDATE_GOLDEN=1, then review the diff)."""
from __future__ import annotations

from pathlib import Path

import pytest

from mugraph import ir, workloads
from mugraph.codegen import generate_cuda
from tests.golden import check_golden

GOLDEN = Path(__file__).parent / "golden"


def elementwise_block_graph():
    """An elementwise-only block graph: two inputs, broadcasting, a chain, one accumulator."""
    X = ir.input("X", (64, 128), "float16")
    S = ir.input("S", (64, 1), "float32")
    b = ir.BlockBuilder(grid=(4, 2, 1), forloop=1)
    x = b.input(X, imap=(0, 1))
    s = b.input(S, imap=(0,))
    out = ((x * s).silu() + 1.0).acc_sum()
    return ir.KernelGraph(b.finish([(out, (0, 1))]), [X, S])


GRAPHS = {
    "rmsnorm_linear_small": lambda: workloads.get("rmsnorm_linear").small().reference(),
    "gqa_safe_small": lambda: workloads.get("gqa_safe").small().reference(),
    "elementwise": elementwise_block_graph,
}


@pytest.mark.parametrize("name", list(GRAPHS))
def test_generated_source_matches_golden(name):
    check_golden(GOLDEN / f"{name}.cu", generate_cuda(GRAPHS[name](), "sm_80"))
