"""The generality suite: programs a JAX user writes, with no hand-written fused kernel to aim at.

Each `Program` is a JAX function at full shapes (what `mugraph bench search` runs) and at small
shapes with the same structure (what the quality tier searches). They cover norm variants,
attention variants (scales, masks, GQA grouping; 4-D model layouts with head-split reshapes and
jnp.repeat of K/V), MLP blocks, bias/activation epilogues,
residuals, softmax/log-softmax/logsumexp, `jnp.where` selects, reductions over either axis,
broadcasts and transposes, in fp16, bf16 and fp32. The search is judged on them (`evaluate`):
lifted or not, fused or not, verified or not, and its estimate against the XLA-like baseline.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, fields, replace
from typing import Callable

import numpy as np

from mugraph import ir
from mugraph.ir import DType, KernelGraph
from mugraph.ir.errors import InvalidInput


@dataclass(frozen=True)
class Program:
    """One user program: a JAX function, its inputs at full and small shapes, one dtype."""

    name: str
    description: str
    fn: Callable
    shapes: dict                      # input name -> full shape, in argument order
    small_shapes: dict
    dtype: DType = DType.FLOAT16
    input_scale: float = 1.0
    kinds: tuple = field(default=())  # norm, attention, mlp, epilogue, softmax, select, ...

    @property
    def inputs(self) -> list[tuple[str, tuple, DType]]:
        return [(name, tuple(shape), self.dtype) for name, shape in self.shapes.items()]

    def example_args(self) -> list:
        import jax
        return [jax.ShapeDtypeStruct(shape, self.dtype.numpy) for shape in self.shapes.values()]

    def spec(self) -> KernelGraph:
        return ir.from_jax(self.fn, *self.example_args(), input_names=list(self.shapes))

    def small(self) -> "Program":
        return replace(self, shapes=dict(self.small_shapes))

    def random_inputs(self, seed: int = 0) -> list[np.ndarray]:
        rng = np.random.default_rng(seed)
        return [(rng.standard_normal(shape) * self.input_scale).astype(self.dtype.numpy)
                for shape in self.shapes.values()]

    def __repr__(self) -> str:
        dims = ", ".join(f"{n}{list(s)}" for n, s in self.shapes.items())
        return f"Program({self.name} {self.dtype.short}: {dims})"


# ---- the programs, written as a user would ------------------------------------------------------
def _jnp():
    import jax.numpy as jnp
    return jnp


def _nn():
    import jax
    return jax.nn


def jax_rsqrt(x):
    import jax
    return jax.lax.rsqrt(x)


def layernorm_linear(X, W):
    jnp = _jnp()
    xf = X.astype(jnp.float32)
    mu = jnp.mean(xf, axis=-1, keepdims=True)
    var = jnp.mean((xf - mu) ** 2, axis=-1, keepdims=True)
    return ((xf - mu) / jnp.sqrt(var + 1e-5)).astype(X.dtype) @ W


def layernorm_affine_linear(X, g, b, W):
    jnp = _jnp()
    mu = jnp.mean(X, axis=-1, keepdims=True)
    var = jnp.var(X, axis=-1, keepdims=True)
    return ((X - mu) * jax_rsqrt(var + 1e-5) * g + b) @ W


def rmsnorm_gamma_linear(X, g, W):
    jnp = _jnp()
    xf = X.astype(jnp.float32)
    r = jax_rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + 1e-6)
    return ((xf * r).astype(X.dtype) * g) @ W


def l2norm_linear(X, W):
    jnp = _jnp()
    return (X / jnp.sqrt(jnp.sum(X * X, axis=-1, keepdims=True) + 1e-6)) @ W


def linear_rmsnorm(X, W):
    jnp = _jnp()
    y = X @ W
    return y * jax_rsqrt(jnp.mean(y * y, axis=-1, keepdims=True) + 1e-6)


def linear_bias_gelu(X, W, b):
    return _nn().gelu(X @ W + b, approximate=False)


def linear_bias_gelu_tanh(X, W, b):
    return _nn().gelu(X @ W + b, approximate=True)


def linear_bias_relu(X, W, b):
    return _nn().relu(X @ W + b)


def linear_silu(X, W):
    return _nn().silu(X @ W)


def linear_sigmoid_residual(X, W, R):
    return _nn().sigmoid(X @ W) + R


def linear_scale_residual(X, W, R):
    return (X @ W) * 0.5 + R


def transposed_weight_bias_relu(X, W, b):
    return _nn().relu(X @ W.T + b)


def activation_polynomial(X, W):
    y = X @ W
    return y * (1.0 + 0.044715 * y * y) + 0.25 * y * y * y - 0.1 * y * y


def elementwise_chain_30(X):
    y = X
    for i in range(10):
        y = y * (1.0 + 0.01 * i)
        y = y + 0.1
        y = _jnp().tanh(y) if i % 2 else _nn().sigmoid(y)
    return y


def swiglu_down(X, W1, W3, W2):
    return (_nn().silu(X @ W1) * (X @ W3)) @ W2


def gated_gelu(X, W1, W2):
    return _nn().gelu(X @ W1) * (X @ W2)


def softplus_linear(X, W):
    return _nn().softplus(X @ W)


def softmax_rows(X):
    return _nn().softmax(X, axis=-1)


def log_softmax_rows(X):
    return _nn().log_softmax(X, axis=-1)


def logsumexp_rows(X):
    return _nn().logsumexp(X, axis=-1, keepdims=True)


def softmax_columns(X):
    return _nn().softmax(X, axis=0)


def attention_scaled(Q, K, V):
    s = (Q @ K.T) / math.sqrt(Q.shape[-1])
    return _nn().softmax(s, axis=-1) @ V


def attention_causal(Q, K, V):
    jnp = _jnp()
    n = Q.shape[0]
    s = (Q @ K.T) * (1.0 / math.sqrt(Q.shape[-1]))
    mask = jnp.tril(jnp.ones((n, n), dtype=bool))
    s = jnp.where(mask, s, -jnp.inf)
    return _nn().softmax(s, axis=-1) @ V


def attention_gqa_grouped(Q, K, V):
    """4 query heads share each KV head: (Hkv, 4*S, D) query rows per KV head."""
    jnp = _jnp()
    hkv, g_s, d = Q.shape
    s = jnp.einsum("hqd,hkd->hqk", Q, K) / math.sqrt(d)
    return jnp.einsum("hqk,hkd->hqd", _nn().softmax(s, axis=-1), V)


def _causal_softmax_values(s, v_dims: str, v):
    """softmax over the last axis of scores `s` masked causally with jnp.finfo.min (a tril mask
    built inside the function, as model code writes it), in fp32, times the values."""
    jnp = _jnp()
    n = s.shape[-1]
    mask = jnp.tril(jnp.ones((n, n), dtype=bool))
    s = jnp.where(mask, s, jnp.finfo(s.dtype).min)
    probs = _nn().softmax(s.astype(jnp.float32), axis=-1).astype(v.dtype)
    return jnp.einsum(v_dims, probs, v)


def attention_4d_causal(Q, K, V):
    """(B, H, S, D) attention written as 4-D einsums with a causal mask."""
    jnp = _jnp()
    s = jnp.einsum("bhsd,bhtd->bhst", Q, K) / math.sqrt(Q.shape[-1])
    return _causal_softmax_values(s, "bhst,bhtd->bhsd", V)


def _heads(x, heads: int):
    b, s, d = x.shape
    return x.reshape(b, s, heads, d // heads)


def mha_head_split_causal(Q, K, V):
    """Multi-head attention on [B, S, D] projections: head-split reshapes, causal, head merge."""
    jnp = _jnp()
    b, s, d = Q.shape
    heads = 2 if d <= 64 else 8
    q, k, v = (_heads(t, heads) for t in (Q, K, V))
    scores = jnp.einsum("bshd,bthd->bhst", q, k) / math.sqrt(d // heads)
    return _causal_softmax_values(scores, "bhst,bthd->bshd", v).reshape(b, s, d)


def gqa_repeat_causal(Q, K, V):
    """Grouped-query attention as Llama writes it: K/V heads repeated with jnp.repeat, causal,
    heads merged back into [B, S, H*D]."""
    jnp = _jnp()
    b, s, h, d = Q.shape
    k, v = (jnp.repeat(t, h // t.shape[2], axis=2) for t in (K, V))
    scores = jnp.einsum("bshd,bthd->bhst", Q, k) / math.sqrt(d)
    return _causal_softmax_values(scores, "bhst,bthd->bshd", v).reshape(b, s, h * d)


def leaky_relu_linear(X, W):
    jnp = _jnp()
    y = X @ W
    return jnp.where(y > 0, y, 0.01 * y)


def threshold_select(X, T):
    jnp = _jnp()
    return jnp.where(X > T, X, jnp.zeros_like(X)) * 2.0


def column_mean_scale(X, s):
    jnp = _jnp()
    return jnp.mean(X * s[None, :], axis=0)


def center_rows(X):
    jnp = _jnp()
    return X - jnp.mean(X, axis=-1, keepdims=True)


def column_bias_linear(X, W, c):
    return X @ W + c[:, None]


def max_over_rows_linear(X, W):
    jnp = _jnp()
    return jnp.max(X @ W, axis=0)


def lora_scaled_bf16(X, W, A, B):
    return X @ W + 0.5 * ((X @ A) @ B)


def residual_rmsnorm(X, R, g):
    jnp = _jnp()
    h = X + R
    return h * jax_rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + 1e-6) * g


F16, BF16, F32 = DType.FLOAT16, DType.BFLOAT16, DType.FLOAT32

_PROGRAMS = [
    Program("layernorm_linear", "LayerNorm(X) @ W (fp32 statistics)", layernorm_linear,
            dict(X=(16, 4096), W=(4096, 4096)), dict(X=(16, 256), W=(256, 256)), F16,
            kinds=("norm", "mlp")),
    Program("layernorm_affine_linear_f32", "(LayerNorm(X) * g + b) @ W, fp32",
            layernorm_affine_linear, dict(X=(16, 2048), g=(2048,), b=(2048,), W=(2048, 2048)),
            dict(X=(16, 256), g=(256,), b=(256,), W=(256, 256)), F32,
            kinds=("norm", "broadcast", "mlp")),
    Program("rmsnorm_gamma_linear_bf16", "(RMSNorm(X) * g) @ W, bf16", rmsnorm_gamma_linear,
            dict(X=(16, 4096), g=(4096,), W=(4096, 4096)),
            dict(X=(16, 256), g=(256,), W=(256, 256)), BF16, kinds=("norm", "broadcast", "mlp")),
    Program("l2norm_linear", "X / ||X|| @ W", l2norm_linear,
            dict(X=(16, 4096), W=(4096, 4096)), dict(X=(16, 256), W=(256, 256)), F16,
            kinds=("norm", "mlp")),
    Program("linear_rmsnorm", "RMSNorm(X @ W) (norm after the matmul)", linear_rmsnorm,
            dict(X=(16, 4096), W=(4096, 1024)), dict(X=(16, 256), W=(256, 128)), F16,
            input_scale=0.5, kinds=("norm", "mlp")),
    Program("linear_bias_gelu", "gelu(X @ W + b), erf form", linear_bias_gelu,
            dict(X=(32, 4096), W=(4096, 4096), b=(4096,)),
            dict(X=(32, 256), W=(256, 256), b=(256,)), F16, input_scale=0.25,
            kinds=("epilogue", "broadcast", "mlp")),
    Program("linear_bias_gelu_tanh_f32", "gelu(X @ W + b), tanh form, fp32", linear_bias_gelu_tanh,
            dict(X=(32, 2048), W=(2048, 2048), b=(2048,)),
            dict(X=(32, 256), W=(256, 256), b=(256,)), F32, input_scale=0.25,
            kinds=("epilogue", "broadcast", "mlp")),
    Program("linear_bias_relu_f32", "relu(X @ W + b), fp32", linear_bias_relu,
            dict(X=(32, 2048), W=(2048, 2048), b=(2048,)),
            dict(X=(32, 256), W=(256, 256), b=(256,)), F32, input_scale=0.25,
            kinds=("epilogue", "broadcast", "mlp")),
    Program("linear_silu_bf16", "silu(X @ W), bf16", linear_silu,
            dict(X=(16, 4096), W=(4096, 4096)), dict(X=(16, 256), W=(256, 256)), BF16,
            input_scale=0.25, kinds=("epilogue", "mlp")),
    Program("linear_sigmoid_residual", "sigmoid(X @ W) + R", linear_sigmoid_residual,
            dict(X=(16, 4096), W=(4096, 4096), R=(16, 4096)),
            dict(X=(16, 256), W=(256, 256), R=(16, 256)), F16, input_scale=0.25,
            kinds=("epilogue", "residual", "mlp")),
    Program("linear_scale_residual", "(X @ W) * 0.5 + R", linear_scale_residual,
            dict(X=(16, 4096), W=(4096, 4096), R=(16, 4096)),
            dict(X=(16, 256), W=(256, 256), R=(16, 256)), F16, input_scale=0.25,
            kinds=("residual", "mlp")),
    Program("transposed_weight_bias_relu", "relu(X @ W.T + b) (weight stored N x K)",
            transposed_weight_bias_relu, dict(X=(16, 4096), W=(4096, 4096), b=(4096,)),
            dict(X=(16, 256), W=(256, 256), b=(256,)), F16, input_scale=0.25,
            kinds=("transpose", "epilogue", "broadcast", "mlp")),
    Program("activation_polynomial", "a degree-3 polynomial of X @ W", activation_polynomial,
            dict(X=(16, 4096), W=(4096, 4096)), dict(X=(16, 256), W=(256, 256)), F16,
            input_scale=0.25, kinds=("epilogue", "mlp")),
    Program("elementwise_chain_30", "30 elementwise ops (scale, shift, sigmoid/tanh) in a row",
            elementwise_chain_30, dict(X=(4096, 4096)), dict(X=(128, 256)), F16,
            kinds=("elementwise",)),
    Program("swiglu_down", "(silu(X @ W1) * (X @ W3)) @ W2", swiglu_down,
            dict(X=(16, 2048), W1=(2048, 4096), W3=(2048, 4096), W2=(4096, 2048)),
            dict(X=(16, 128), W1=(128, 256), W3=(128, 256), W2=(256, 128)), F16,
            input_scale=0.25, kinds=("mlp",)),
    Program("gated_gelu", "gelu(X @ W1) * (X @ W2)", gated_gelu,
            dict(X=(8, 4096), W1=(4096, 4096), W2=(4096, 4096)),
            dict(X=(8, 256), W1=(256, 256), W2=(256, 256)), F16, input_scale=0.25,
            kinds=("mlp", "epilogue")),
    Program("softplus_linear_f32", "softplus(X @ W), fp32", softplus_linear,
            dict(X=(16, 2048), W=(2048, 2048)), dict(X=(16, 256), W=(256, 256)), F32,
            input_scale=0.25, kinds=("epilogue", "mlp")),
    Program("softmax_rows", "softmax over the last axis", softmax_rows,
            dict(X=(4096, 4096)), dict(X=(128, 256)), F16, kinds=("softmax",)),
    Program("log_softmax_rows_f32", "log_softmax over the last axis, fp32", log_softmax_rows,
            dict(X=(4096, 4096)), dict(X=(128, 256)), F32, kinds=("softmax",)),
    Program("logsumexp_rows", "jax.nn.logsumexp over the last axis", logsumexp_rows,
            dict(X=(4096, 4096)), dict(X=(128, 256)), F32, kinds=("softmax", "select")),
    Program("softmax_columns", "softmax over axis 0", softmax_columns,
            dict(X=(4096, 4096)), dict(X=(256, 128)), F16, kinds=("softmax", "axis0")),
    Program("attention_scaled", "softmax(Q @ K.T / sqrt(d)) @ V", attention_scaled,
            dict(Q=(64, 128), K=(4096, 128), V=(4096, 128)),
            dict(Q=(64, 64), K=(512, 64), V=(512, 64)), F16, input_scale=0.5,
            kinds=("attention", "transpose")),
    Program("attention_causal", "causal softmax(Q @ K.T / sqrt(d)) @ V (jnp.tril mask)",
            attention_causal, dict(Q=(1024, 64), K=(1024, 64), V=(1024, 64)),
            dict(Q=(128, 64), K=(128, 64), V=(128, 64)), F16, input_scale=0.5,
            kinds=("attention", "select", "transpose")),
    Program("attention_gqa_grouped", "GQA: 4 query heads per KV head, batched over KV heads",
            attention_gqa_grouped, dict(Q=(8, 64, 128), K=(8, 2048, 128), V=(8, 2048, 128)),
            dict(Q=(2, 64, 64), K=(2, 256, 64), V=(2, 256, 64)), F16, input_scale=0.5,
            kinds=("attention", "transpose")),
    Program("attention_4d_causal", "(B, H, S, D) causal attention as 4-D einsums (tril, finfo.min)",
            attention_4d_causal, dict(Q=(2, 8, 1024, 64), K=(2, 8, 1024, 64), V=(2, 8, 1024, 64)),
            dict(Q=(2, 2, 32, 16), K=(2, 2, 32, 16), V=(2, 2, 32, 16)), F16, input_scale=0.5,
            kinds=("attention", "select", "4d")),
    Program("mha_head_split_causal", "multi-head causal attention: head-split reshapes of "
            "[B, S, D] inputs, head merge", mha_head_split_causal,
            dict(Q=(1, 1024, 512), K=(1, 1024, 512), V=(1, 1024, 512)),
            dict(Q=(1, 32, 32), K=(1, 32, 32), V=(1, 32, 32)), F16, input_scale=0.5,
            kinds=("attention", "select", "reshape", "4d")),
    Program("gqa_repeat_causal", "GQA as Llama writes it: jnp.repeat of K/V heads, causal, "
            "heads merged", gqa_repeat_causal,
            dict(Q=(1, 1024, 8, 64), K=(1, 1024, 2, 64), V=(1, 1024, 2, 64)),
            dict(Q=(1, 32, 4, 16), K=(1, 32, 2, 16), V=(1, 32, 2, 16)), F16, input_scale=0.5,
            kinds=("attention", "select", "repeat", "reshape", "4d")),
    Program("leaky_relu_linear", "jnp.where(y > 0, y, 0.01 * y) of y = X @ W", leaky_relu_linear,
            dict(X=(16, 4096), W=(4096, 4096)), dict(X=(16, 256), W=(256, 256)), F16,
            input_scale=0.25, kinds=("select", "epilogue", "mlp")),
    Program("threshold_select_f32", "jnp.where(X > T, X, 0) * 2, fp32", threshold_select,
            dict(X=(4096, 4096), T=(4096, 4096)), dict(X=(128, 256), T=(128, 256)), F32,
            kinds=("select", "elementwise")),
    Program("column_mean_scale", "mean over axis 0 of X * s[None, :]", column_mean_scale,
            dict(X=(4096, 4096), s=(4096,)), dict(X=(256, 128), s=(128,)), F32,
            kinds=("axis0", "broadcast")),
    Program("center_rows", "X - mean(X, axis=-1)", center_rows, dict(X=(4096, 4096)),
            dict(X=(128, 256)), F16, kinds=("norm",)),
    Program("column_bias_linear", "X @ W + c[:, None] (a per-row bias)", column_bias_linear,
            dict(X=(64, 4096), W=(4096, 4096), c=(64,)),
            dict(X=(64, 256), W=(256, 256), c=(64,)), F16, input_scale=0.25,
            kinds=("broadcast", "mlp")),
    Program("max_over_rows_linear", "max over axis 0 of X @ W", max_over_rows_linear,
            dict(X=(64, 4096), W=(4096, 4096)), dict(X=(64, 256), W=(256, 256)), F16,
            input_scale=0.25, kinds=("axis0", "mlp")),
    Program("lora_scaled_bf16", "X @ W + 0.5 * (X @ A) @ B, bf16", lora_scaled_bf16,
            dict(X=(16, 4096), W=(4096, 4096), A=(4096, 16), B=(16, 4096)),
            dict(X=(16, 256), W=(256, 256), A=(256, 16), B=(16, 256)), BF16, input_scale=0.25,
            kinds=("mlp",)),
    Program("residual_rmsnorm", "RMSNorm(X + R) * g", residual_rmsnorm,
            dict(X=(16, 4096), R=(16, 4096), g=(4096,)), dict(X=(16, 256), R=(16, 256), g=(256,)),
            F16, kinds=("norm", "residual", "broadcast")),
]
_SUITE = {p.name: p for p in _PROGRAMS}


def names() -> list[str]:
    return list(_SUITE)


def get(name: str) -> Program:
    try:
        return _SUITE[name]
    except KeyError:
        raise InvalidInput(f"unknown generality program {name!r}",
                           hint=f"one of {', '.join(_SUITE)}") from None


def all_programs() -> list[Program]:
    return list(_PROGRAMS)


# ---- how a program is judged ----------------------------------------------------------------------
@dataclass(frozen=True)
class Outcome:
    """What the search made of one program: one row of `bench/generality.py`, one case of the
    quality tier. Times in seconds, estimates in microseconds on the config's target."""

    program: str
    dtype: str
    shapes: dict
    lifted: bool
    lift_error: str | None = None          # the front end's UnsupportedOp (or other) message
    search_error: str | None = None        # a SearchError that ended the search
    origin: str | None = None              # "search" (a found μGraph) or "spec" (unfused)
    custom_kernels: int = 0
    library_ops: tuple = ()                # kernels the winner still launches as library calls
    structure: str = ""
    winner_us: float | None = None
    xla_us: float | None = None            # the XLA-like baseline (search/baseline.py)
    unfused_us: float | None = None        # one library launch per op
    verdict: str | None = None             # check() at the real shapes; None when the spec won
    best_found_s: float | None = None      # time to the winner (None when the spec won)
    best_found_states: int | None = None   # ... and the states visited by then
    search_s: float | None = None          # time to stop: the enumeration
    wall_s: float | None = None            # the whole call, the final check included
    stop_reason: str | None = None
    states: int = 0
    verified: int = 0
    spec: KernelGraph | None = field(default=None, repr=False, compare=False)
    winner: KernelGraph | None = field(default=None, repr=False, compare=False)

    @property
    def fused(self) -> bool:
        return self.origin == "search" and self.custom_kernels > 0

    @property
    def fully_fused(self) -> bool:
        return self.fused and not self.library_ops

    @property
    def equivalent(self) -> bool:
        return self.verdict == "EQUIVALENT"

    @property
    def speedup(self) -> float | None:
        """Estimated speedup of the winner over the XLA-like baseline (the headline)."""
        return self.xla_us / self.winner_us if self.winner_us else None

    @property
    def speedup_vs_unfused(self) -> float | None:
        return self.unfused_us / self.winner_us if self.winner_us else None

    @property
    def beats_xla(self) -> bool:
        """Faster than the baseline by more than rounding: equal estimates summed in another order are a tie."""
        return self.speedup is not None and self.speedup > 1.0 + 1e-9

    def to_dict(self) -> dict:
        row = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("spec", "winner")}
        return row | {"fused": self.fused, "speedup": self.speedup,
                               "speedup_vs_unfused": self.speedup_vs_unfused}


def evaluate(program: Program, config=None, *, progress=None) -> Outcome:
    """Lift `program`, search it under `config` (default: `SearchConfig()`), and judge the winner
    against the XLA-like baseline and the unfused program. Lift and search failures that are
    mugraph's typed errors are recorded, not raised."""
    from mugraph.errors import MugraphError
    from mugraph.search import SearchConfig, search
    from mugraph.search.baseline import xla_estimate
    config = config or SearchConfig()
    base = dict(program=program.name, dtype=program.dtype.short,
                shapes={k: list(v) for k, v in program.shapes.items()})
    try:
        spec = program.spec()
    except MugraphError as e:
        return Outcome(**base, lifted=False, lift_error=f"{type(e).__name__}: {e.message}")
    xla = xla_estimate(spec, config.target).seconds * 1e6
    started = time.monotonic()
    try:
        result = search(spec, config, progress=progress or (lambda *a: None))
    except MugraphError as e:
        return Outcome(**base, lifted=True, xla_us=xla, wall_s=time.monotonic() - started,
                       search_error=f"{type(e).__name__}: {e.message}", spec=spec)
    return _outcome(base, result, xla)


def _outcome(base: dict, result, xla_us: float) -> Outcome:
    best, rep = result.best_candidate, result.report
    verification = rep.verification
    verdict = None if verification is None else (
        "EQUIVALENT" if verification.equivalent else f"NOT EQUIVALENT: {verification.reason}")
    return Outcome(**base, lifted=True, origin=best.origin,
                   custom_kernels=len(best.graph.custom_ops()),
                   library_ops=library_ops(best.estimate), structure=best.structure,
                   winner_us=best.seconds * 1e6, xla_us=xla_us,
                   unfused_us=rep.spec_estimate.seconds * 1e6, verdict=verdict,
                   best_found_s=rep.best_found_seconds,
                   best_found_states=rep.best_found_states, search_s=rep.search_seconds,
                   wall_s=rep.wall_seconds, stop_reason=rep.stop_reason, states=rep.states,
                   verified=rep.verified, spec=result.spec, winner=best.graph)


def library_ops(estimate) -> tuple[str, ...]:
    """The kernels an estimate launches as library calls (views cost nothing and are not
    launched), e.g. ('%2 matmul',)."""
    return tuple(k.name for k in estimate.kernels if k.kind != "custom")
