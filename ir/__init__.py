"""The three-level IR: kernel graphs of device tensors, block graphs of tiles, thread-level chains.

Build graphs with nodes (`input`, arithmetic methods, `BlockBuilder`), check them by construction,
print them, save them as JSON, and run them with the reference interpreter.
"""
from mugraph.ir.block import (BlockBuilder, BlockGraph, BlockInput, BlockOutput, Phase, custom,
                              phases)
from mugraph.ir.dtypes import DType
from mugraph.ir.errors import (InvalidGraph, InvalidInput, MugraphError, ShapeError,
                               UnsupportedOp)
from mugraph.ir.graph import KernelGraph
from mugraph.ir.interpret import interpret, run_block_graph
from mugraph.ir.node import BNode, KNode, concat, kernel_constant as constant, \
    kernel_input as input, kernel_iota as iota, kernel_table as table, toposort
from mugraph.ir.ops import BOp, KOp, TOp
from mugraph.ir.serialize import from_dict, from_json, load, save, to_dict, to_json
from mugraph.ir.thread import ThreadChain, thread_chains


def from_jax(fn, *example_args, **kwargs) -> KernelGraph:
    """Trace `fn` with jax.make_jaxpr and lift the jaxpr into a KernelGraph (see `jax_frontend`).

    Anything the front end does not foresee is an UnsupportedOp naming the function and the
    original error, never a raw exception from inside the lifting rules."""
    from mugraph.ir.jax_frontend import from_jax as _from_jax
    try:
        return _from_jax(fn, *example_args, **kwargs)
    except MugraphError:
        raise
    except Exception as e:
        name = getattr(fn, "__name__", type(fn).__name__)
        raise UnsupportedOp(f"mugraph could not lift {name}: {type(e).__name__}: {e}",
                            primitive="unknown",
                            hint="the program uses a construct the JAX front end does not "
                                 "handle (e.g. PRNG keys, integer or boolean values); keep it "
                                 "outside the function you superoptimize") from e


__all__ = ["BlockBuilder", "BlockGraph", "BlockInput", "BlockOutput", "BNode", "BOp", "DType",
           "InvalidGraph", "InvalidInput", "KernelGraph", "KNode", "KOp", "MugraphError", "Phase",
           "ShapeError", "TOp", "ThreadChain", "UnsupportedOp", "concat", "constant", "custom",
           "from_dict", "from_jax", "from_json", "input", "interpret", "iota", "load", "phases",
           "run_block_graph", "save", "table", "thread_chains", "to_dict", "to_json", "toposort"]
