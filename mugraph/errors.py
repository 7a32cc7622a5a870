"""The typed errors of mugraph, defined in the lowest layer that raises them (`mugraph.ir.errors`)."""
from mugraph.ir.errors import (CacheWarning, CompileError, Interrupted, InvalidGraph, InvalidInput,
                               MugraphError, NoDevice, ResourceError, SearchError, ShapeError,
                               UnsupportedOp, VerificationError)

__all__ = ["MugraphError", "KernelFault", "InvalidGraph", "ShapeError", "UnsupportedOp", "InvalidInput",
           "CompileError", "ResourceError", "NoDevice", "VerificationError", "SearchError", "CacheWarning", "Interrupted"]


def __getattr__(name: str):
    # KernelFault (the CPU harness stopped a generated kernel) lives with the harness; importing
    # it here lazily keeps `mugraph.errors` light
    if name == "KernelFault":
        from mugraph.codegen.cpu import KernelFault
        return KernelFault
    raise AttributeError(f"module 'mugraph.errors' has no attribute {name!r}")
