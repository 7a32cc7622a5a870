"""A hand-written generated module (CUDA source + launch plan) that exercises the GPU runtime without the
generator: a custom kernel, a library matmul and a second custom kernel, joined by two intermediates.

    T = 2 * X          custom  twice(X, T)        X (8, 128) f16 -> T f32
    P = T @ W          library MATMUL (T, W, P)   W (128, 64) f16 -> P f32
    Y = P + 1          custom  add_one(P, Y)      Y (8, 64) f16, the output
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mugraph import ir
from mugraph.ir import DType

SOURCE = r"""#include "tc_intrin.cuh"
// Hand-written kernels for the runtime's tests: raw pointers only, shapes as compile-time constants.
constexpr int X_SIZE = 8 * 128, Y_SIZE = 8 * 64;

MG_GLOBAL void MG_LAUNCH_BOUNDS(128) twice(const mg_half* __restrict__ x, float* __restrict__ t) {
  const int i = mg_bid_x() * mg_bdim_x() + mg_tid_x();
  if (i < X_SIZE) t[i] = 2.0f * mg_h2f(x[i]);
}

MG_GLOBAL void MG_LAUNCH_BOUNDS(64) add_one(const float* __restrict__ p, mg_half* __restrict__ y) {
  const int i = mg_bid_x() * mg_bdim_x() + mg_tid_x();
  if (i < Y_SIZE) y[i] = mg_f2h(p[i] + 1.0f);
}
"""


@dataclass(frozen=True)
class Buffer:
    name: str
    shape: tuple
    dtype: DType
    role: str


@dataclass(frozen=True)
class KernelLaunch:
    name: str
    kind: str
    grid: tuple
    block: tuple
    smem_bytes: int
    args: tuple
    library_op: object = None
    tensor_maps: tuple = ()
    cluster: tuple = (1, 1, 1)


@dataclass(frozen=True)
class LaunchPlan:
    kernels: tuple
    buffers: tuple
    inputs: tuple
    outputs: tuple


@dataclass(frozen=True)
class GeneratedModule:
    source: str
    plan: LaunchPlan
    arch: str


F16, F32 = DType.FLOAT16, DType.FLOAT32
BUFFERS = (Buffer("X", (8, 128), F16, "input"), Buffer("W", (128, 64), F16, "input"),
           Buffer("T", (8, 128), F32, "intermediate"), Buffer("P", (8, 64), F32, "intermediate"),
           Buffer("Y", (8, 64), F16, "output"))


def matmul_node():
    return ir.input("T", (8, 128), "float32") @ ir.input("W", (128, 64), "float16")


def plan(**changes) -> LaunchPlan:
    kernels = (KernelLaunch("twice", "custom", (8, 1, 1), (128, 1, 1), 0, ("X", "T")),
               KernelLaunch("matmul", "library", (1, 1, 1), (1, 1, 1), 0, ("T", "W", "P"), matmul_node()),
               KernelLaunch("add_one", "custom", (8, 1, 1), (64, 1, 1), 0, ("P", "Y")))
    fields = dict(kernels=kernels, buffers=BUFFERS, inputs=("X", "W"), outputs=("Y",)) | changes
    return LaunchPlan(**fields)


def module(arch: str = "sm_80", **plan_changes) -> GeneratedModule:
    return GeneratedModule(SOURCE, plan(**plan_changes), arch)


def inputs(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((8, 128)).astype(np.float16), rng.standard_normal((128, 64)).astype(np.float16)]


def expected(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Y in float64 from the same fp16 inputs (T and P are fp32 on the device: compare with a tolerance)."""
    return (2.0 * x.astype(np.float64)) @ w.astype(np.float64) + 1.0
