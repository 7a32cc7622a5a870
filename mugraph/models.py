"""The model suite: whole layers as JAX users write them, at full and reduced dims.

Each `Layer` is a function `fn(params, *inputs)` of a parameter pytree (a dict of arrays, a Flax
NNX `State`, or an Equinox module partitioned into its arrays) and activations, written as model
code is: multi-head attention with head-split reshapes and einsums, rotary embeddings with slices
and `concatenate`, GQA by `jnp.repeat`, causal masks from `jnp.tril` / `arange`, `jnp.finfo.min`
as a mask value, fused QKV with `jnp.split`, top-k routing. `Layer.at(dims)` builds the function,
its example arguments (`jax.ShapeDtypeStruct` pytrees) and random concrete arguments for one set
of dims; `full` is the model's real size (Llama-3-8B, GPT-2, BERT-base, ...) and `small` the same
structure at dims a CPU runs in seconds.

Nothing here is mugraph-specific: these are the programs `mugraph.jit` and `superoptimize` must
take as written (`mugraph bench models` and tests/models/ use them).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from mugraph.ir.errors import InvalidInput

NEG_INF_MASK = "finfo.min"   # how the layers mask: jnp.finfo(dtype).min, as Flax and HF do


# ---- shared building blocks (plain jax.numpy, as model code writes them) -------------------------
def rms_norm(x, weight, eps=1e-6):
    import jax
    import jax.numpy as jnp
    xf = x.astype(jnp.float32)
    ms = jnp.mean(xf * xf, axis=-1, keepdims=True)
    return (xf * jax.lax.rsqrt(ms + eps)).astype(x.dtype) * weight


def layer_norm(x, weight, bias, eps=1e-5):
    import jax
    import jax.numpy as jnp
    xf = x.astype(jnp.float32)
    mean = jnp.mean(xf, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(xf - mean), axis=-1, keepdims=True)
    return ((xf - mean) * jax.lax.rsqrt(var + eps)).astype(x.dtype) * weight + bias


def rotate_half(x):
    import jax.numpy as jnp
    half = x.shape[-1] // 2
    return jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def rope_tables(positions, head_dim, theta=500000.0, dtype=None):
    """cos and sin of shape [S, head_dim] for float positions [S] (Llama's rotate-half layout)."""
    import jax.numpy as jnp
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    angles = positions.astype(jnp.float32)[:, None] * inv_freq[None, :]
    angles = jnp.concatenate([angles, angles], axis=-1)
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    return (cos, sin) if dtype is None else (cos.astype(dtype), sin.astype(dtype))


def apply_rope(x, cos, sin):
    """x [B, S, H, D]; cos/sin [S, D]."""
    return x * cos[None, :, None, :] + rotate_half(x) * sin[None, :, None, :]


def attention(q, k, v, mask=None):
    """q [B, S, H, D], k/v [B, T, H, D]; mask broadcastable to [B, H, S, T] (True = keep)."""
    import jax
    import jax.numpy as jnp
    scores = jnp.einsum("bshd,bthd->bhst", q, k) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = jnp.where(mask, scores, jnp.finfo(scores.dtype).min)
    probs = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(q.dtype)
    return jnp.einsum("bhst,bthd->bshd", probs, v)


def swiglu(x, w_gate, w_up, w_down):
    import jax
    return (jax.nn.silu(x @ w_gate) * (x @ w_up)) @ w_down


# ---- Llama-3 decoder layer -------------------------------------------------------------------------
def llama_prefill(params, x, *, heads, kv_heads):
    """A Llama-3 decoder layer over a prompt: x [B, S, D] -> [B, S, D] (causal, RoPE, GQA)."""
    import jax.numpy as jnp
    b, s, d = x.shape
    hd = d // heads
    h = rms_norm(x, params["attn_norm"])
    q = (h @ params["wq"]).reshape(b, s, heads, hd)
    k = (h @ params["wk"]).reshape(b, s, kv_heads, hd)
    v = (h @ params["wv"]).reshape(b, s, kv_heads, hd)
    cos, sin = rope_tables(jnp.arange(s), hd, dtype=x.dtype)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    k = jnp.repeat(k, heads // kv_heads, axis=2)
    v = jnp.repeat(v, heads // kv_heads, axis=2)
    causal = jnp.tril(jnp.ones((s, s), dtype=bool))
    o = attention(q, k, v, causal[None, None]).reshape(b, s, d)
    x = x + o @ params["wo"]
    h = rms_norm(x, params["mlp_norm"])
    return x + swiglu(h, params["w_gate"], params["w_up"], params["w_down"])


def llama_decode(params, x, k_cache, v_cache, pos, *, heads, kv_heads):
    """One decode step: x [B, 1, D], caches [B, T, KVH, hd], pos an int32 scalar (the new token's
    slot). Writes the new K/V into the caches and attends over positions <= pos. Returns
    (out [B, 1, D], k_cache, v_cache)."""
    import jax
    import jax.numpy as jnp
    b, _, d = x.shape
    hd = d // heads
    t = k_cache.shape[1]
    h = rms_norm(x, params["attn_norm"])
    q = (h @ params["wq"]).reshape(b, 1, heads, hd)
    k = (h @ params["wk"]).reshape(b, 1, kv_heads, hd)
    v = (h @ params["wv"]).reshape(b, 1, kv_heads, hd)
    cos, sin = rope_tables(jnp.reshape(pos, (1,)), hd, dtype=x.dtype)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    k_cache = jax.lax.dynamic_update_slice(k_cache, k, (0, pos, 0, 0))
    v_cache = jax.lax.dynamic_update_slice(v_cache, v, (0, pos, 0, 0))
    keys = jnp.repeat(k_cache, heads // kv_heads, axis=2)
    values = jnp.repeat(v_cache, heads // kv_heads, axis=2)
    valid = (jnp.arange(t) <= pos)[None, None, None, :]
    o = attention(q, keys, values, valid).reshape(b, 1, d)
    x = x + o @ params["wo"]
    h = rms_norm(x, params["mlp_norm"])
    return x + swiglu(h, params["w_gate"], params["w_up"], params["w_down"]), k_cache, v_cache


def _llama_params(dims, dtype):
    d, f, heads, kv = dims["d"], dims["ffn"], dims["heads"], dims["kv_heads"]
    hd = d // heads
    return {"attn_norm": ((d,), 1.0, dtype), "wq": ((d, d), d ** -0.5, dtype),
            "wk": ((d, kv * hd), d ** -0.5, dtype), "wv": ((d, kv * hd), d ** -0.5, dtype),
            "wo": ((d, d), d ** -0.5, dtype), "mlp_norm": ((d,), 1.0, dtype),
            "w_gate": ((d, f), d ** -0.5, dtype), "w_up": ((d, f), d ** -0.5, dtype),
            "w_down": ((f, d), f ** -0.5, dtype)}


# ---- GPT-2 block (pre-LN, fused QKV, GELU MLP) ------------------------------------------------------
def gpt2_block(params, x, *, heads):
    import jax
    import jax.numpy as jnp
    b, s, d = x.shape
    h = layer_norm(x, params["ln1_w"], params["ln1_b"])
    qkv = h @ params["w_qkv"] + params["b_qkv"]
    q, k, v = jnp.split(qkv, 3, axis=-1)
    q, k, v = (t.reshape(b, s, heads, d // heads) for t in (q, k, v))
    i = jnp.arange(s)
    causal = i[:, None] >= i[None, :]
    o = attention(q, k, v, causal[None, None]).reshape(b, s, d)
    x = x + o @ params["w_proj"] + params["b_proj"]
    h = layer_norm(x, params["ln2_w"], params["ln2_b"])
    h = jax.nn.gelu(h @ params["w_fc"] + params["b_fc"], approximate=True)
    return x + h @ params["w_out"] + params["b_out"]


def _gpt2_params(dims, dtype):
    d, f = dims["d"], 4 * dims["d"]
    return {"ln1_w": ((d,), 1.0, dtype), "ln1_b": ((d,), 0.02, dtype),
            "w_qkv": ((d, 3 * d), d ** -0.5, dtype), "b_qkv": ((3 * d,), 0.02, dtype),
            "w_proj": ((d, d), d ** -0.5, dtype), "b_proj": ((d,), 0.02, dtype),
            "ln2_w": ((d,), 1.0, dtype), "ln2_b": ((d,), 0.02, dtype),
            "w_fc": ((d, f), d ** -0.5, dtype), "b_fc": ((f,), 0.02, dtype),
            "w_out": ((f, d), f ** -0.5, dtype), "b_out": ((d,), 0.02, dtype)}


# ---- BERT / ViT encoder block (post-LN, bidirectional) ---------------------------------------------
def bert_block(params, x, *, heads):
    import jax
    b, s, d = x.shape
    hd = d // heads
    q = (x @ params["wq"] + params["bq"]).reshape(b, s, heads, hd)
    k = (x @ params["wk"] + params["bk"]).reshape(b, s, heads, hd)
    v = (x @ params["wv"] + params["bv"]).reshape(b, s, heads, hd)
    o = attention(q, k, v).reshape(b, s, d)
    x = layer_norm(x + o @ params["wo"] + params["bo"], params["ln1_w"], params["ln1_b"])
    h = jax.nn.gelu(x @ params["w_fc"] + params["b_fc"], approximate=False)
    return layer_norm(x + h @ params["w_out"] + params["b_out"], params["ln2_w"], params["ln2_b"])


def _bert_params(dims, dtype):
    d, f = dims["d"], 4 * dims["d"]
    p = {n: ((d, d), d ** -0.5, dtype) for n in ("wq", "wk", "wv", "wo")}
    p |= {n: ((d,), 0.02, dtype) for n in ("bq", "bk", "bv", "bo", "b_out", "ln1_b", "ln2_b")}
    p |= {"ln1_w": ((d,), 1.0, dtype), "ln2_w": ((d,), 1.0, dtype),
          "w_fc": ((d, f), d ** -0.5, dtype), "b_fc": ((f,), 0.02, dtype),
          "w_out": ((f, d), f ** -0.5, dtype)}
    return p


# ---- a small mixture of experts (softmax router, top-k, experts by einsum) --------------------------
def moe_layer(params, x, *, top_k):
    """x [T, D]; experts are SwiGLU MLPs held as [E, D, F] / [E, F, D] weights, all computed by
    einsum; the router keeps the top-k softmax weights per token (renormalised)."""
    import jax
    import jax.numpy as jnp
    gates = jax.nn.softmax((x @ params["router"]).astype(jnp.float32), axis=-1)
    top, idx = jax.lax.top_k(gates, top_k)
    keep = jnp.sum(jax.nn.one_hot(idx, gates.shape[-1], dtype=gates.dtype), axis=-2)
    weights = (gates * keep / jnp.sum(top, axis=-1, keepdims=True)).astype(x.dtype)
    hidden = jax.nn.silu(jnp.einsum("td,edf->tef", x, params["w_gate"])) * \
        jnp.einsum("td,edf->tef", x, params["w_up"])
    out = jnp.einsum("tef,efd->ted", hidden, params["w_down"])
    return jnp.einsum("te,ted->td", weights, out)


def soft_moe_layer(params, x):
    """Softly gated: every expert weighted by the router's softmax (no top-k): one liftable program."""
    import jax
    import jax.numpy as jnp
    weights = jax.nn.softmax(x @ params["router"], axis=-1)
    hidden = jax.nn.gelu(jnp.einsum("td,edf->tef", x, params["w_up"]))
    out = jnp.einsum("tef,efd->ted", hidden, params["w_down"])
    return jnp.einsum("te,ted->td", weights, out)


def _moe_params(dims, dtype):
    d, f, e = dims["d"], dims["ffn"], dims["experts"]
    return {"router": ((d, e), d ** -0.5, dtype), "w_gate": ((e, d, f), d ** -0.5, dtype),
            "w_up": ((e, d, f), d ** -0.5, dtype), "w_down": ((e, f, d), f ** -0.5, dtype)}


def _soft_moe_params(dims, dtype):
    p = _moe_params(dims, dtype)
    del p["w_gate"]
    return p


# ---- the single-head transformer block of issue 15 ---------------------------------------------------
def single_head_block(params, x):
    """RMSNorm -> Q/K/V -> causal attention (jnp.tril, where(..., -inf)) -> output projection ->
    residual -> RMSNorm -> SwiGLU -> residual; x [S, D]."""
    import jax
    import jax.numpy as jnp
    s, d = x.shape
    h = rms_norm(x, params["attn_norm"])
    q, k, v = h @ params["wq"], h @ params["wk"], h @ params["wv"]
    scores = (q @ k.T) / math.sqrt(d)
    scores = jnp.where(jnp.tril(jnp.ones((s, s), dtype=bool)), scores, -jnp.inf)
    x = x + jax.nn.softmax(scores, axis=-1) @ v @ params["wo"]
    h = rms_norm(x, params["mlp_norm"])
    return x + swiglu(h, params["w_gate"], params["w_up"], params["w_down"])


def _single_head_params(dims, dtype):
    d, f = dims["d"], dims["ffn"]
    p = {n: ((d, d), d ** -0.5, dtype) for n in ("wq", "wk", "wv", "wo")}
    return p | {"attn_norm": ((d,), 1.0, dtype), "mlp_norm": ((d,), 1.0, dtype),
                "w_gate": ((d, f), d ** -0.5, dtype), "w_up": ((d, f), d ** -0.5, dtype),
                "w_down": ((f, d), f ** -0.5, dtype)}


# ---- blocks built from library modules (Flax NNX, Equinox) -----------------------------------------
@functools.cache
def _nnx_class():
    """The Flax NNX block class (defined once: graphdefs of two instances must compare equal)."""
    from flax import nnx
    import jax

    class Block(nnx.Module):
        def __init__(self, d, heads, dtype, rngs):
            self.ln1 = nnx.LayerNorm(d, rngs=rngs, param_dtype=dtype, dtype=dtype)
            self.attn = nnx.MultiHeadAttention(num_heads=heads, in_features=d, decode=False,
                                               rngs=rngs, param_dtype=dtype, dtype=dtype)
            self.ln2 = nnx.LayerNorm(d, rngs=rngs, param_dtype=dtype, dtype=dtype)
            self.fc = nnx.Linear(d, 4 * d, rngs=rngs, param_dtype=dtype, dtype=dtype)
            self.out = nnx.Linear(4 * d, d, rngs=rngs, param_dtype=dtype, dtype=dtype)

        def __call__(self, x):
            mask = nnx.make_causal_mask(x[..., 0])
            x = x + self.attn(self.ln1(x), mask=mask)
            return x + self.out(jax.nn.gelu(self.fc(self.ln2(x))))
    return Block


def _nnx_block(dims, dtype, seed):
    """A pre-LN block of Flax NNX modules: (graphdef, state). Flax is an optional extra."""
    from flax import nnx
    model = _nnx_class()(dims["d"], dims["heads"], dtype, nnx.Rngs(seed))
    return nnx.split(model)


def nnx_block_fn(graphdef):
    from flax import nnx

    def fn(state, x):
        return nnx.merge(graphdef, state)(x)
    return fn


@functools.cache
def _eqx_class():
    """The Equinox block class (defined once: partitions of two instances must combine)."""
    import equinox as eqx
    import jax
    import jax.numpy as jnp

    class Block(eqx.Module):
        ln1: eqx.nn.LayerNorm
        attn: eqx.nn.MultiheadAttention
        ln2: eqx.nn.LayerNorm
        fc: eqx.nn.Linear
        out: eqx.nn.Linear

        def __init__(self, d, heads, dtype, key):
            k1, k2, k3 = jax.random.split(key, 3)
            self.ln1 = eqx.nn.LayerNorm(d, dtype=dtype)
            self.attn = eqx.nn.MultiheadAttention(heads, d, key=k1, dtype=dtype)
            self.ln2 = eqx.nn.LayerNorm(d, dtype=dtype)
            self.fc = eqx.nn.Linear(d, 4 * d, key=k2, dtype=dtype)
            self.out = eqx.nn.Linear(4 * d, d, key=k3, dtype=dtype)

        def __call__(self, x):
            s = x.shape[0]
            causal = jnp.tril(jnp.ones((s, s), dtype=bool))
            h = jax.vmap(self.ln1)(x)
            x = x + self.attn(h, h, h, mask=causal)
            h = jax.vmap(self.ln2)(x)
            return x + jax.vmap(self.out)(jax.nn.gelu(jax.vmap(self.fc)(h)))
    return Block


def _eqx_block(dims, dtype, seed):
    """A pre-LN block of Equinox modules, partitioned into (arrays, static)."""
    import equinox as eqx
    import jax
    model = _eqx_class()(dims["d"], dims["heads"], dtype, jax.random.PRNGKey(seed))
    return eqx.partition(model, eqx.is_array)


def eqx_block_fn(static):
    import equinox as eqx

    def fn(params, x):
        return eqx.combine(params, static)(x)
    return fn


# ---- the suite ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Instance:
    """One layer at one set of dims: the function, its example arguments (ShapeDtypeStruct
    pytrees, params first) and a way to draw concrete arguments."""

    name: str
    fn: Callable
    example_args: tuple
    draw: Callable                    # seed -> tuple of concrete arguments (params first)
    dims: dict

    def args(self, seed: int = 0) -> tuple:
        return self.draw(seed)


@dataclass(frozen=True)
class Layer:
    """A model layer with its full dims (the real model's) and small dims (same structure)."""

    name: str
    description: str
    full: dict
    small: dict
    build: Callable                   # (dims, seed) -> Instance
    extra: str = ""                   # an optional package the layer needs ("flax", "equinox")
    tags: tuple = field(default=())

    def at(self, dims: dict | str = "small", seed: int = 0) -> Instance:
        dims = {"small": self.small, "full": self.full}.get(dims, dims) if isinstance(dims, str) \
            else dims
        if not isinstance(dims, dict):
            raise InvalidInput(f"dims must be 'small', 'full' or a dict, got {dims!r}")
        return self.build(self, dims, seed)

    def available(self) -> bool:
        """Whether the optional package the layer is built from is installed."""
        if not self.extra:
            return True
        import importlib.util
        return importlib.util.find_spec(self.extra) is not None


def _draw_tree(spec: dict, seed: int):
    rng = np.random.default_rng(seed)
    return {name: (rng.standard_normal(shape) * scale).astype(dtype) if scale != 1.0 or
            len(shape) > 1 else (1.0 + 0.1 * rng.standard_normal(shape)).astype(dtype)
            for name, (shape, scale, dtype) in spec.items()}


def _struct_tree(spec: dict):
    import jax
    return {name: jax.ShapeDtypeStruct(shape, dtype) for name, (shape, _, dtype) in spec.items()}


def _dtype(dims):
    import jax.numpy as jnp
    return jnp.dtype(dims.get("dtype", "float32"))


def _plain(params_fn, fn_of, acts_fn):
    """A builder for layers whose params are a dict: params_fn(dims, dtype) gives
    {name: (shape, scale, dtype)}, fn_of(dims) the function, acts_fn(dims, dtype) the activations
    as [(shape, dtype, kind)] with kind "normal" or an int32 value for integer inputs."""
    def build(layer, dims, seed):
        import jax
        dtype = _dtype(dims)
        spec = params_fn(dims, dtype)
        acts = acts_fn(dims, dtype)
        example = (_struct_tree(spec),) + tuple(jax.ShapeDtypeStruct(s, d) for s, d, _ in acts)

        def draw(seed):
            rng = np.random.default_rng(seed + 1000)
            values = [np.asarray(kind, d) if not isinstance(kind, str) else
                      (rng.standard_normal(s)).astype(d) for s, d, kind in acts]
            return (_draw_tree(spec, seed),) + tuple(values)
        return Instance(layer.name, fn_of(dims), example, draw, dims)
    return build


def _library(make, fn_of, acts_fn):
    """A builder for layers made of library modules: make(dims, dtype, seed) -> (static, params)
    or (params, static) as the library orders them; fn_of(static) the function of (params, x)."""
    def build(layer, dims, seed):
        import jax
        dtype = _dtype(dims)
        static, params = make(dims, dtype, seed)
        acts = acts_fn(dims, dtype)
        leaves, tree = jax.tree_util.tree_flatten(params)
        example = (jax.tree_util.tree_unflatten(
            tree, [jax.ShapeDtypeStruct(np.shape(a), a.dtype) for a in leaves]),) + \
            tuple(jax.ShapeDtypeStruct(s, d) for s, d, _ in acts)

        def draw(seed):
            rng = np.random.default_rng(seed + 1000)
            _, fresh = make(dims, dtype, seed)
            return (fresh,) + tuple(rng.standard_normal(s).astype(d) for s, d, _ in acts)
        return Instance(layer.name, fn_of(static), example, draw, dims)
    return build


def _nnx_make(dims, dtype, seed):
    graphdef, state = _nnx_block(dims, dtype, seed)
    return graphdef, state


def _eqx_make(dims, dtype, seed):
    params, static = _eqx_block(dims, dtype, seed)
    return static, params


def _seq_acts(dims, dtype):
    return [((dims.get("batch", 1), dims["seq"], dims["d"]), dtype, "normal")]


def _decode_acts(dims, dtype):
    b, t, kv, hd = dims.get("batch", 1), dims["cache"], dims["kv_heads"], \
        dims["d"] // dims["heads"]
    return [((b, 1, dims["d"]), dtype, "normal"), ((b, t, kv, hd), dtype, "normal"),
            ((b, t, kv, hd), dtype, "normal"), ((), np.int32, dims.get("pos", t // 2))]


_LLAMA_FULL = dict(d=4096, heads=32, kv_heads=8, ffn=14336, dtype="bfloat16")
_LLAMA_SMALL = dict(d=128, heads=4, kv_heads=2, ffn=256, dtype="bfloat16")

LAYERS = {layer.name: layer for layer in [
    Layer("llama3_decode", "Llama-3-8B decoder layer, one decode step (batch 1, KV cache input, "
          "RoPE, GQA 32/8, SwiGLU)", _LLAMA_FULL | dict(cache=4096),
          _LLAMA_SMALL | dict(cache=64),
          _plain(_llama_params, lambda dims: functools.partial(
              llama_decode, heads=dims["heads"], kv_heads=dims["kv_heads"]), _decode_acts),
          tags=("decode", "attention", "rope", "gqa")),
    Layer("llama3_prefill", "Llama-3-8B decoder layer over a 512-token prompt (causal)",
          _LLAMA_FULL | dict(seq=512), _LLAMA_SMALL | dict(seq=16),
          _plain(_llama_params, lambda dims: functools.partial(
              llama_prefill, heads=dims["heads"], kv_heads=dims["kv_heads"]), _seq_acts),
          tags=("prefill", "attention", "rope", "gqa")),
    Layer("gpt2_block", "GPT-2 block (pre-LN LayerNorm with bias, fused QKV + jnp.split, GELU)",
          dict(d=768, heads=12, seq=512, dtype="float16"),
          dict(d=64, heads=2, seq=16, dtype="float16"),
          _plain(_gpt2_params, lambda dims: functools.partial(gpt2_block, heads=dims["heads"]),
                 _seq_acts), tags=("attention", "layernorm")),
    Layer("bert_block", "BERT-base / ViT encoder block (bidirectional, post-LN, GELU)",
          dict(d=768, heads=12, seq=512, dtype="float16"),
          dict(d=64, heads=2, seq=16, dtype="float16"),
          _plain(_bert_params, lambda dims: functools.partial(bert_block, heads=dims["heads"]),
                 _seq_acts), tags=("attention", "layernorm", "encoder")),
    Layer("moe_top2", "MoE layer: softmax router, top-2 of 8 experts, SwiGLU experts by einsum",
          dict(d=1024, ffn=2048, experts=8, tokens=256, dtype="bfloat16"),
          dict(d=64, ffn=128, experts=4, tokens=16, dtype="bfloat16"),
          _plain(_moe_params, lambda dims: functools.partial(moe_layer, top_k=2),
                 lambda dims, dtype: [((dims["tokens"], dims["d"]), dtype, "normal")]),
          tags=("moe",)),
    Layer("soft_moe", "softly gated MoE: every expert weighted by the router's softmax",
          dict(d=1024, ffn=2048, experts=8, tokens=256, dtype="bfloat16"),
          dict(d=64, ffn=128, experts=4, tokens=16, dtype="bfloat16"),
          _plain(_soft_moe_params, lambda dims: soft_moe_layer,
                 lambda dims, dtype: [((dims["tokens"], dims["d"]), dtype, "normal")]),
          tags=("moe",)),
    Layer("single_head_block", "issue 15's single-head transformer block (x 64x128 fp32)",
          dict(d=128, ffn=256, seq=64, dtype="float32"),
          dict(d=64, ffn=128, seq=32, dtype="float32"),
          _plain(_single_head_params, lambda dims: single_head_block,
                 lambda dims, dtype: [((dims["seq"], dims["d"]), dtype, "normal")]),
          tags=("attention",)),
    Layer("nnx_block", "pre-LN block of Flax NNX modules (LayerNorm, MultiHeadAttention with "
          "make_causal_mask, Linear), called through nnx.split / nnx.merge",
          dict(d=768, heads=12, seq=512, batch=1, dtype="float32"),
          dict(d=64, heads=2, seq=16, batch=1, dtype="float32"),
          _library(_nnx_make, nnx_block_fn, _seq_acts), extra="flax", tags=("library",)),
    Layer("eqx_block", "pre-LN block of Equinox modules (LayerNorm, MultiheadAttention, Linear), "
          "called through eqx.partition / eqx.combine",
          dict(d=768, heads=12, seq=512, dtype="float32"),
          dict(d=64, heads=2, seq=16, dtype="float32"),
          _library(_eqx_make, eqx_block_fn,
                   lambda dims, dtype: [((dims["seq"], dims["d"]), dtype, "normal")]),
          extra="equinox", tags=("library",)),
]}


def names() -> list[str]:
    return list(LAYERS)


def get(name: str) -> Layer:
    try:
        return LAYERS[name]
    except KeyError:
        raise InvalidInput(f"unknown model layer {name!r}", hint=f"one of {', '.join(LAYERS)}") \
            from None


def stack(instance: Instance, layers: int) -> Instance:
    """`layers` copies of a one-activation layer applied in sequence, each with its own params
    (a list of param pytrees): identical regions at identical shapes, every layer of a model."""
    if layers < 1:
        raise InvalidInput(f"layers={layers} must be at least 1")
    fn = instance.fn

    def stacked(params_list, x, *rest):
        for params in params_list:
            x = fn(params, x, *rest)
        return x

    example = ([instance.example_args[0]] * layers,) + tuple(instance.example_args[1:])

    def draw(seed):
        first = instance.draw(seed)
        return ([instance.draw(seed + i)[0] for i in range(layers)],) + tuple(first[1:])
    return replace(instance, name=f"{instance.name}_x{layers}", fn=stacked,
                   example_args=example, draw=draw)
