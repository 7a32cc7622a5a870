"""mugraph: a superoptimizer and kernel compiler for tensor programs.

It lifts a small tensor program (a JAX function or a graph built with `mugraph.ir`) into μGraphs
spanning the GPU's kernel, block and thread levels, searches equivalent programs for fused
kernels, verifies the winner, and generates tensor-core CUDA.
"""
from mugraph import errors, ir
from mugraph.settings import settings

__version__ = "0.1.0"

_API = {"superoptimize", "jit", "Kernel", "Program"}


def __getattr__(name: str):
    # the API pulls in search, verify and codegen; load them on first use, not on `import mugraph`
    if name in _API:
        from mugraph import api
        return getattr(api, name)
    if name in ("workloads", "testing", "search", "verify", "codegen"):
        import importlib
        return importlib.import_module(f"mugraph.{name}")
    raise AttributeError(f"module 'mugraph' has no attribute {name!r}")


__all__ = ["Kernel", "Program", "errors", "ir", "jit", "settings", "superoptimize", "__version__"]
