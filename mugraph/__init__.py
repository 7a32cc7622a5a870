"""mugraph: a superoptimizer and kernel compiler for tensor programs.

It lifts a small tensor program (a JAX function or a graph built with `mugraph.ir`) into μGraphs
spanning the GPU's kernel, block and thread levels, searches equivalent programs for fused
kernels, verifies the winner, and generates tensor-core CUDA.
"""
from mugraph import errors, ir
from mugraph.settings import settings

__version__ = "0.1.0"

__all__ = ["errors", "ir", "settings", "__version__"]
