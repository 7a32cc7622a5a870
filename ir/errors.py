"""The typed errors every layer raises; re-exported to users as `mugraph.errors`.

Each error says what is wrong, where (the field, the IR excerpt or the user's source line) and how
to fix it. Messages are built when the error is raised by user-facing code; inside the search,
rejections are enum values, never formatted exceptions.
"""
from __future__ import annotations


class MugraphError(Exception):
    """The root of every error mugraph raises on purpose."""

    def __init__(self, message: str, *, hint: str | None = None):
        self.message = message
        self.hint = hint
        super().__init__(self._render())

    def _render(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"


class InvalidGraph(MugraphError):
    """A graph (built, loaded from JSON, or produced by a pass) breaks a rule of the IR.

    `field` names the offending part, e.g. ``nodes[3].arg.imap`` or ``block_graphs[0].forloop``.
    """

    def __init__(self, message: str, *, field: str | None = None, hint: str | None = None):
        self.field = field
        super().__init__(f"{field}: {message}" if field else message, hint=hint)
        self.message = message  # without the field, so a caller can re-raise it at another field


class ShapeError(InvalidGraph):
    """Shapes that do not fit an op: mismatched operands, splits that do not divide, bad dims."""


class UnsupportedOp(MugraphError):
    """The front end met a primitive (or a form of one) that mugraph cannot lift."""

    def __init__(self, message: str, *, primitive: str, equation: str | None = None,
                 source: str | None = None, hint: str | None = None):
        self.primitive = primitive
        self.equation = equation
        self.source = source
        parts = [message]
        if equation:
            parts.append(f"  equation: {equation}")
        if source:
            parts.append(f"  at: {source}")
        super().__init__("\n".join(parts), hint=hint)


class InvalidInput(MugraphError):
    """Arrays passed to a graph do not match its inputs (count, shape or dtype), or a bad argument."""


class CompileError(MugraphError):
    """An external compiler (NVRTC, nvcc, g++) rejected generated code; carries the log and a repro."""

    def __init__(self, message: str, *, log: str = "", source_excerpt: str = "",
                 repro: str = "", hint: str | None = None):
        self.log = log
        self.source_excerpt = source_excerpt
        self.repro = repro
        parts = [message]
        if source_excerpt:
            parts.append("  source:\n" + source_excerpt)
        if log:
            parts.append("  log:\n" + log)
        if repro:
            parts.append(f"  repro: {repro}")
        super().__init__("\n".join(parts), hint=hint)


class ResourceError(MugraphError):
    """A kernel does not fit the target: shared memory, registers, threads or grid limits."""


class NoDevice(MugraphError):
    """A GPU is needed but none is present; the message names what runs without one."""


class VerificationError(MugraphError):
    """A graph could not be verified (e.g. no usable random test could be drawn)."""


class SearchError(MugraphError):
    """A search could not run as configured (bad config, unsupported spec)."""


class CacheWarning(UserWarning):
    """A cache location or entry could not be used as is: a temporary folder, or a rebuild, stands in."""


class Interrupted(KeyboardInterrupt):
    """A search stopped by Ctrl-C or SIGTERM. A KeyboardInterrupt, so `except Exception` never
    swallows it. `.result` holds what was found so far: from `superoptimize`, a Kernel (the best
    structure verified so far, else the spec itself; its `origin` says which); from
    `search.cached.cached_search`, a `Partial` (the best graph, or None)."""

    def __init__(self, message: str, result=None):
        super().__init__(message)
        self.result = result
