"""The typed errors of mugraph, defined in the lowest layer that raises them (`mugraph.ir.errors`)."""
from mugraph.ir.errors import (CompileError, InvalidGraph, InvalidInput, MugraphError, NoDevice,
                               ResourceError, SearchError, ShapeError, UnsupportedOp,
                               VerificationError)

__all__ = ["MugraphError", "InvalidGraph", "ShapeError", "UnsupportedOp", "InvalidInput",
           "CompileError", "ResourceError", "NoDevice", "VerificationError", "SearchError"]
