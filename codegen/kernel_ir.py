"""What lowering one block graph produces: the kernel's parameters as the block sees them, its shared buffers
before placement, and its steps (pieces of C with the shared buffers each reads and writes)."""
from __future__ import annotations

from dataclasses import dataclass, field

from mugraph.codegen.layouts import TileLayout
from mugraph.ir.block import BlockGraph
from mugraph.ir.dtypes import DType


@dataclass(frozen=True)
class InputView:
    """A kernel parameter as one block input sees it: element strides into the parameter's buffer.

    ``iota``: (stride, extent) when the input is an index tensor the kernel computes instead of loading (no
    parameter): the element at offset o of its row-major root holds (o / stride) % extent. ``offset``: the
    element the view starts at (a slice's window).
    """

    param: str | None
    dtype: DType
    strides: tuple
    iota: tuple | None = None
    offset: int = 0
    divisors: tuple = ()   # per dim: element i of a repeated dim (jnp.repeat) reads element i // r

    @property
    def repeats(self) -> tuple:
        return self.divisors or (1,) * len(self.strides)


@dataclass(frozen=True)
class OutputView:
    """A kernel parameter one block output is stored to: row-major, or through ``strides`` (an output
    view: a transpose or reshape of the output that the kernel writes in place, ``ir.layout.output_views``)."""

    param: str
    strides: tuple | None = None


@dataclass
class SmemBuffer:
    """One shared-memory buffer before placement."""

    name: str
    nbytes: int             # all stages together
    role: str               # tile | fp32 | operand | scratch
    what: str
    layout: TileLayout | None = None
    stages: int = 1
    ldmatrix: bool = False  # read by ldmatrix (its layout must be conflict-free)
    align: int = 0          # bytes its start needs beyond the arch's alignment (a swizzle period; 0: none)


@dataclass
class Step:
    """A piece of kernel code: ``decls`` at the region's scope, ``lines`` in a block of their own."""

    region: str                       # pro | loop | epi
    lines: list
    decls: list = field(default_factory=list)
    reads: set = field(default_factory=set)
    writes: set = field(default_factory=set)
    group: int | None = None          # cp.async group its writes belong to
    note: str = ""


@dataclass
class KernelIR:
    name: str
    graph: BlockGraph
    params: list                      # (C name, dtype, const)
    buffers: dict
    steps: list
    kernel_decls: list                # index variables, pointers to globals' bases
    acc_decls: list                   # accumulator state, declared before the loop
    loop_head: list                   # stage pointers of this iteration
    stages: int
    has_stage_buffers: bool
    staged_inputs: list               # buffers written by the loop's cp.async issue (excluded from hazards)
    splits: int = 1                   # CTAs sharing one block's loop
    state_floats: int = 0             # partial state each of them publishes (floats)
    split_state_floats: int = 0       # the partial state one CTA would publish were the loop split (any split)
    pipeline: object = None           # sm_90a: the TMA pipeline (hopper_pipeline.TmaPipeline), or None
    async_reads: bool = False         # sm_90a: wgmma reads shared memory (generic writes are fenced for it)
    path: str = "sync"                # "sync" (cp.async + mma.sync) or "hopper" (sm_90a: TMA pipeline, wgmma)
    wgmma_flops: int = 0              # tensor-core FLOPs of a loop trip's products on wgmma

    @property
    def block_threads(self) -> int:
        """Threads a CTA launches with: the block graph's, plus the producer warpgroup of a TMA pipeline."""
        return self.pipeline.threads if self.pipeline else self.graph.threads

    @property
    def trips(self) -> int:
        """Loop iterations one CTA runs."""
        return self.graph.forloop // self.splits
