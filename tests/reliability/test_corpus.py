"""The bad-input corpus: malformed graphs, unsupported programs, hostile shapes, bad flags and
settings, cache faults and missing compilers. Each case asserts a typed error (a MugraphError,
with the offending value and a hint in its message) or a correct result; never a raw exception,
a hang or a silent wrong answer. Interrupts are in test_interrupts.py; more cache faults (damaged
CPU-harness and NVRTC builds, wrong cache entries, concurrent writers) in tests/test_cache.py.

`python -m tests.reliability.test_corpus` prints the table of cases and expected outcomes.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings
from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mugraph
from mugraph import errors, ir, workloads
from mugraph.api import Kernel, load_function
from mugraph.search import SearchConfig

S = jax.ShapeDtypeStruct
A = S((8, 32), jnp.float32)
QUICK = {"max_kernel_ops": 1, "budget_seconds": 5}


@dataclass(frozen=True)
class Case:
    name: str
    category: str
    run: Callable                # (tmp_path) -> value
    error: type | None = None    # the typed error expected, or None for a result
    match: str = ""              # regex the message (or, for results, repr) must contain
    check: Callable | None = None  # for results: value -> bool

    @property
    def outcome(self) -> str:
        if self.error is not None:
            return f"{self.error.__name__}: /{self.match}/"
        return f"result: {self.match or 'correct'}"


CASES: list[Case] = []


def case(name, category, error=None, match="", check=None):
    def register(run):
        CASES.append(Case(name, category, run, error, match, check))
        return run
    return register


# ---- helpers ----------------------------------------------------------------------------------------
def _lora():
    return workloads.get("lora").small()


def _spec_json(mutate):
    data = json.loads(ir.to_json(_lora().spec()))
    mutate(data)
    return ir.from_json(json.dumps(data))


def _block_json(mutate):
    data = json.loads(ir.to_json(_lora().reference()))
    mutate(data["block_graphs"][0])
    return ir.from_json(json.dumps(data))


def _kernel():
    w = _lora()
    return Kernel(w.reference(), w.spec())


def _search(fn, *args, **config):
    return mugraph.superoptimize(fn, *args, config=QUICK | config, progress=False, cache=False)


def _cli(*argv):
    from mugraph.cli import main
    try:
        return main(list(argv))
    except SystemExit as e:  # argparse's own usage errors
        return e.code


def _same_as_spec(kernel, args):
    arrays = [np.random.default_rng(0).standard_normal(a.shape).astype(a.dtype) for a in args]
    got = kernel.run_reference(*arrays)
    want = ir.interpret(kernel.spec, arrays)
    got = got if isinstance(got, list) else [got]
    return all(np.array_equal(g, w) for g, w in zip(got, want))


# ---- malformed graphs --------------------------------------------------------------------------------
G = "malformed graph"
case("not JSON", G, errors.InvalidGraph, r"not valid JSON")(lambda t: ir.from_json("{oops"))
case("JSON list", G, errors.InvalidGraph, r"expected a JSON object")(lambda t: ir.from_json("[]"))
case("missing nodes", G, errors.InvalidGraph, r"missing field 'nodes'")(
    lambda t: _spec_json(lambda d: d.pop("nodes")))
case("unknown op", G, errors.InvalidGraph, r"nodes\[4\]\.op: unknown kernel-level op 'fft'")(
    lambda t: _spec_json(lambda d: d["nodes"][4].update(op="fft")))
case("forward reference", G, errors.InvalidGraph, r"9 does not name an earlier node")(
    lambda t: _spec_json(lambda d: d["nodes"][4].update(srcs=[9, 0])))
case("integer dtype", G, errors.InvalidGraph, r"unknown dtype 'int8'")(
    lambda t: _spec_json(lambda d: d["nodes"][0]["arg"].update(dtype="int8")))
case("rank 5", G, errors.ShapeError, r"1 to 4 positive ints")(
    lambda t: _spec_json(lambda d: d["nodes"][0]["arg"].update(shape=[1, 1, 1, 16, 128])))
case("zero extent", G, errors.ShapeError, r"\(0, 128\)")(
    lambda t: _spec_json(lambda d: d["nodes"][0]["arg"].update(shape=[0, 128])))
case("negative extent", G, errors.ShapeError, r"\(-16, 128\)")(
    lambda t: _spec_json(lambda d: d["nodes"][0]["arg"].update(shape=[-16, 128])))
case("matmul inner dims", G, errors.ShapeError, r"inner dims 64 and 128 differ")(
    lambda t: _spec_json(lambda d: d["nodes"][0]["arg"].update(shape=[16, 64])))
case("duplicate output names", G, errors.InvalidGraph, r"must be unique")(
    lambda t: _spec_json(lambda d: d.update(output_names=["a", "a"], outputs=d["outputs"] * 2)))
case("unknown format", G, errors.InvalidGraph, r"format")(
    lambda t: _spec_json(lambda d: d.update(format="onnx")))
case("imap out of range", G, errors.InvalidGraph, r"maps a grid axis to dim 7")(
    lambda t: _block_json(lambda b: b["nodes"][0]["arg"].update(imap=[7, None, None])))
case("zero grid", G, errors.InvalidGraph, r"grid \(0, 1, 1\)")(
    lambda t: _block_json(lambda b: b.update(grid=[0, 1, 1])))
case("forloop not dividing", G, errors.ShapeError, r"forloop 3 does not divide")(
    lambda t: _block_json(lambda b: b.update(forloop=3)))
case("5000 threads", G, errors.InvalidGraph, r"threads=5000")(
    lambda t: _block_json(lambda b: b.update(threads=5000)))
case("omap twice the same dim", G, errors.InvalidGraph, r"same dim")(
    lambda t: _block_json(lambda b: b["outputs"][0].update(omap=[0, 0, None])))
case("no outputs", G, errors.InvalidGraph, r"at least one output")(lambda t: ir.KernelGraph([]))
case("missing file", G, errors.MugraphError, r"cannot read graph file .*No such file")(
    lambda t: ir.load(t / "nope.json"))
case("a folder as a graph file", G, errors.MugraphError, r"cannot read graph file")(
    lambda t: ir.load(t))
case("matmul shapes in the builder", G, errors.ShapeError, r"inner dims 5 and 4")(
    lambda t: ir.input("a", (4, 5), "float32") @ ir.input("b", (4, 5), "float32"))

# ---- unsupported programs ----------------------------------------------------------------------------
U = "unsupported program"
case("sort", U, errors.UnsupportedOp, r"cannot lift `sort`")(
    lambda t: ir.from_jax(jnp.sort, A))
case("cumsum", U, errors.UnsupportedOp, r"cumsum")(
    lambda t: ir.from_jax(lambda x: jax.lax.cumsum(x, 0), A))
case("fori_loop", U, errors.UnsupportedOp, r"scan|while")(
    lambda t: ir.from_jax(lambda x: jax.lax.fori_loop(0, 3, lambda i, v: v * 2, x), A))
case("PRNG inside", U, errors.UnsupportedOp, r"could not lift")(
    lambda t: ir.from_jax(lambda x: x + jax.random.normal(jax.random.PRNGKey(0), (8, 32)), A))
case("integer input", U, errors.InvalidInput, r"dtype int32")(
    lambda t: ir.from_jax(lambda x: x * 2, S((8, 32), jnp.int32)))
case("float64 input", U, errors.InvalidInput, r"dtype float64")(
    lambda t: ir.from_jax(lambda x: x * 2, S((8, 32), np.float64)))
case("integer output", U, errors.UnsupportedOp, r"int32")(
    lambda t: ir.from_jax(lambda x: (x * 2).astype(jnp.int32), A))
case("boolean output", U, errors.UnsupportedOp, r"`gt`|bool")(lambda t: ir.from_jax(lambda x: x > 0, A))
case("Python if on a value", U, errors.InvalidInput, r"TracerBoolConversionError")(
    lambda t: ir.from_jax(lambda x: x if x.sum() > 0 else -x, A))
case("function raises", U, errors.InvalidInput, r"ZeroDivisionError")(
    lambda t: ir.from_jax(lambda x: 1 / 0, A))
case("integer output", U, errors.UnsupportedOp, r"int32")(
    lambda t: ir.from_jax(lambda x: jnp.argmax(x, axis=-1), A))
case("integer input", U, errors.InvalidInput, r"int32")(
    lambda t: ir.from_jax(lambda x: x * 2, S((4,), jnp.int32)))
case("not a function", U, errors.InvalidInput, r"JAX function or a KernelGraph")(
    lambda t: mugraph.superoptimize(42))
case("string argument", U, errors.InvalidInput, r"is a str, not an array")(
    lambda t: ir.from_jax(lambda x: x * 2, "x"))
case("missing example arguments", U, errors.InvalidInput, r"missing 1 required positional")(
    lambda t: mugraph.superoptimize(lambda x: x * 2))
case("graph with example arguments", U, errors.InvalidInput, r"takes no example arguments")(
    lambda t: mugraph.superoptimize(_lora().spec(), 1))

# ---- hostile shapes and inputs -----------------------------------------------------------------------
H = "hostile shape or input"
case("rank 5 argument", H, errors.InvalidInput, r"rank 5")(
    lambda t: ir.from_jax(lambda x: x * 2, S((1, 1, 1, 8, 32), jnp.float32)))
case("zero-size argument", H, errors.ShapeError, r"\(0, 32\)")(
    lambda t: ir.from_jax(lambda x: x * 2, S((0, 32), jnp.float32)))
case("larger than the GPU", H, errors.ResourceError, r"283.5 GB, more than the h100's 80 GB")(
    lambda t: _search(lambda x, w: x @ w, S((2**20, 2**16), jnp.float16),
                      S((2**16, 2**16), jnp.float16)))
case("prime extents", H, check=lambda k: _same_as_spec(k, [S((7, 13), jnp.float32)] * 2),
     match="the kernel computes the spec")(
    lambda t: _search(lambda x, y: x * y + x, S((7, 13), jnp.float32), S((7, 13), jnp.float32)))
case("1x1 matmul", H, check=lambda k: _same_as_spec(k, [S((1, 1), jnp.float32)] * 2),
     match="the kernel computes the spec")(
    lambda t: _search(lambda x, w: x @ w, S((1, 1), jnp.float32), S((1, 1), jnp.float32)))
case("too few arrays", H, errors.InvalidInput, r"takes 4 inputs .* got 2")(
    lambda t: _kernel().run_reference(*_lora().random_inputs(0)[:2]))
case("wrong shape", H, errors.InvalidInput, r"input 'X' has shape \(4, 128\)")(
    lambda t: _kernel().run_reference(_lora().random_inputs(0)[0][:4], *_lora().random_inputs(0)[1:]))
case("wrong dtype", H, errors.InvalidInput, r"dtype float32, the kernel expects float16")(
    lambda t: _kernel().run_on_cpu(*[a.astype(np.float32) for a in _lora().random_inputs(0)]))
case("explicit cast", H, check=lambda out: out.shape == (16, 256) and out.dtype == np.float64,
     match="cast=True converts, one array back")(
    lambda t: _kernel().run_reference(*[a.astype(np.float32) for a in _lora().random_inputs(0)],
                                      cast=True))
case("a string as an array", H, errors.InvalidInput, r"input 'X' has shape \(\)")(
    lambda t: _kernel().run_reference("x", *_lora().random_inputs(0)[1:]))
case("NaN and inf inputs", H, check=lambda ok: ok, match="NaN/inf propagate as in the spec")(
    lambda t: _nan_inputs_agree())
case("as_jax wrong shape under jit", H, errors.InvalidInput, r"shape \(8, 128\)")(
    lambda t: jax.jit(_kernel().as_jax("harness"))(
        *[jnp.zeros((8, 128), jnp.float16)] + _lora().random_inputs(0)[1:]))
case("Python number to mugraph.jit", H, errors.InvalidInput, r"argument leaf 1 is a float")(
    lambda t: mugraph.jit(lambda x, s: x * s, backend="harness")(jnp.ones((8, 32)), 2.0))


def _nan_inputs_agree() -> bool:
    w = _lora()
    arrays = w.random_inputs(0)
    arrays[0][0, :] = np.nan
    arrays[0][1, 0] = np.inf
    k = _kernel()
    got, want = k.run_reference(*arrays), ir.interpret(k.spec, arrays)[0]
    return bool(np.array_equal(np.isnan(got), np.isnan(want)) and np.isnan(got[0]).all())


# ---- degenerate programs -----------------------------------------------------------------------------
D = "degenerate program"
for _name, _fn in [("identity", lambda x: x), ("constant output", lambda x: jnp.zeros((8, 32))),
                   ("unused input", lambda x, y: x * 2.0), ("output twice", lambda x: (x, x))]:
    _args = [A, A] if _name == "unused input" else [A]
    case(_name, D, check=lambda k, a=_args: _same_as_spec(k, a) and "winner:" in k.result.summary(),
         match="a kernel and a report")(lambda t, f=_fn, a=_args: _search(f, *a))

# ---- bad flags and settings --------------------------------------------------------------------------
F = "bad flag or setting"
case("negative max_kernel_ops", F, errors.SearchError, r"max_kernel_ops=-1")(
    lambda t: SearchConfig(max_kernel_ops=-1))
case("NaN budget", F, errors.SearchError, r"budget_seconds=nan")(
    lambda t: SearchConfig(budget_seconds=float("nan")))
case("fractional op count", F, errors.SearchError, r"whole number")(
    lambda t: SearchConfig(max_kernel_ops=2.5))
case("op list as a string", F, errors.SearchError, r"is one string")(
    lambda t: SearchConfig(kernel_ops="matmul"))
case("unknown op in config", F, errors.SearchError, r"unknown kernel op 'fft'")(
    lambda t: SearchConfig(kernel_ops=("fft",)))
case("unknown target", F, errors.SearchError, r"unknown target 'v100'")(
    lambda t: mugraph.superoptimize(_lora().spec(), target="v100"))
case("config of the wrong type", F, errors.InvalidInput, r"SearchConfig or a dict")(
    lambda t: mugraph.superoptimize(_lora().spec(), config=3))
case("unknown config field", F, errors.SearchError, r"unknown SearchConfig fields \['budget'\]")(
    lambda t: mugraph.superoptimize(_lora().spec(), config={"budget": 3}))
case("budget as text", F, errors.SearchError, r"budget_seconds='3'")(
    lambda t: mugraph.superoptimize(_lora().spec(), budget_seconds="3"))
case("config JSON not an object", F, errors.SearchError, r"must be an object")(
    lambda t: SearchConfig.from_json("[1, 2]"))
case("unknown backend", F, errors.InvalidInput, r"unknown backend 'gpu'")(
    lambda t: mugraph.jit(lambda x: x, backend="gpu"))
case("unknown executor", F, errors.SearchError, r"unknown executor 'ray'")(
    lambda t: __import__("mugraph.search.executors", fromlist=["x"]).make_executor(2, "ray"))
case("unreachable Dask scheduler", F, errors.SearchError,
     r"cannot reach the Dask scheduler at 'tcp://127.0.0.1:9'")(lambda t: _dask("tcp://127.0.0.1:9"))
case("empty Dask address", F, errors.SearchError, r"address '  ' is empty")(lambda t: _dask("  "))
for _var, _value in [("MUGRAPH_Z3_RLIMIT", "lots"), ("MUGRAPH_PROGRESS", "maybe"),
                     ("MUGRAPH_SEARCH_SECONDS", "1m")]:
    case(f"{_var}={_value}", F, errors.InvalidInput, f"{_var}='{_value}' is not a valid value")(
        lambda t, v=_var, x=_value: _with_env(v, x))
case("CLI: unknown workload", F, check=lambda rc: rc == 2, match="exit 2, the choices named")(
    lambda t: _cli("search", "no_such_workload"))
case("CLI: negative budget", F, check=lambda rc: rc == 2, match="exit 2")(
    lambda t: _cli("search", "lora", "--small", "--budget", "-1"))
case("CLI: NaN budget", F, check=lambda rc: rc == 2, match="exit 2")(
    lambda t: _cli("search", "lora", "--small", "--budget", "nan"))
case("CLI: unknown GPU", F, check=lambda rc: rc == 2, match="argparse: exit 2")(
    lambda t: _cli("search", "lora", "--target-gpu", "v100"))
case("CLI: verify a spec without a candidate", F, check=lambda rc: rc == 2, match="exit 2")(
    lambda t: _cli("verify", str(_saved(t, "spec", _lora().spec()))))
case("CLI: verify a candidate of other inputs", F, check=lambda rc: rc == 2, match="exit 2")(
    lambda t: _cli("verify", str(_saved(t, "spec", _lora().spec())),
                   str(_saved(t, "other", workloads.get("gqa").small().reference()))))
case("CLI: verify a wrong candidate", F, check=lambda rc: rc == 1, match="exit 1, NOT EQUIVALENT")(
    lambda t: _cli("verify", str(_saved(t, "spec", _lora().spec())),
                   str(_saved(t, "wrong", _negated(_lora().reference())))))
case("CLI: verify a right candidate", F, check=lambda rc: rc == 0, match="exit 0, EQUIVALENT")(
    lambda t: _cli("verify", str(_saved(t, "spec", _lora().spec())),
                   str(_saved(t, "right", _lora().reference()))))
case("CLI: candidate not JSON", F, check=lambda rc: rc == 2, match="exit 2")(
    lambda t: _cli("verify", "lora", "candidate.py"))
case("CLI: unknown cache key", F, check=lambda rc: rc == 2, match="exit 2")(
    lambda t: _cli("cache", "show", "feedbeef"))
BROKEN, NO_ARGS = "def f(x):\n    return x *\n", "def f(x):\n    return x\n"
case("FILE.py with a syntax error", F, errors.MugraphError, r"SyntaxError")(
    lambda t: load_function(str(_file(t, BROKEN)) + ":f"))
case("FILE.py without example args", F, errors.InvalidInput, r"must define f_args")(
    lambda t: load_function(str(_file(t, NO_ARGS)) + ":f"))
case("FILE.py without the function", F, errors.InvalidInput, r"has no function 'g'")(
    lambda t: load_function(str(_file(t, NO_ARGS)) + ":g"))
case("FILE.py that does not exist", F, errors.InvalidInput, r"no such file")(
    lambda t: load_function("nowhere.py:f"))
_ONE = "import jax, jax.numpy as jnp\ndef f(x):\n    return x * 2\nf_args = {}\n"
case("FILE.py with f_args = 5", F, errors.InvalidInput, r"f_args = 5 is a int, not a list")(
    lambda t: load_function(str(_file(t, _ONE.format("5"))) + ":f"))
case("FILE.py with f_args one struct, no list", F, errors.InvalidInput,
     r"is a ShapeDtypeStruct, not a list")(
    lambda t: load_function(str(_file(t, _ONE.format("jax.ShapeDtypeStruct((4, 4), jnp.float32)")))
                            + ":f"))
case("FILE.py with f_args a dict", F, errors.InvalidInput, r"is a dict, not a list")(
    lambda t: load_function(str(_file(t, _ONE.format("{'x': 1}"))) + ":f"))
case("FILE.py with f_args = [5]", F, errors.InvalidInput, r"example argument 0 is a int")(
    lambda t: _traced(_file(t, _ONE.format("[5]"))))
case("CLI: search FILE.py:f with f_args = 5", F, check=lambda rc: rc == 2, match="exit 2")(
    lambda t: _cli("search", str(_file(t, _ONE.format("5"))) + ":f", "--budget", "3"))
case("search(..., progress=False)", F, check=lambda r: r.report.stop_reason == "exhausted",
     match="a result, no progress shown")(
    lambda t: mugraph.search.search(ir.from_jax(lambda x: x * 2, A),
                                    SearchConfig(max_kernel_ops=1, budget_seconds=5),
                                    progress=False))
case("search(..., progress='yes')", F, errors.SearchError, r"progress='yes' is not a callable")(
    lambda t: mugraph.search.search(ir.from_jax(lambda x: x * 2, A), SearchConfig(),
                                    progress="yes"))


def _dask(address):
    pytest.importorskip("dask.distributed")
    from mugraph.search import executors
    old, executors.CONNECT_SECONDS = executors.CONNECT_SECONDS, 1.0
    try:
        return executors.make_executor(1, "dask", address)
    finally:
        executors.CONNECT_SECONDS = old


def _with_env(var, value):
    from mugraph.settings import KNOBS, settings
    name = next(n for n, k in KNOBS.items() if k.env == var)
    os.environ[var] = value
    try:
        return getattr(settings, name)
    finally:
        del os.environ[var]


def _saved(folder, name, graph):
    path = folder / f"{name}.json"
    ir.save(graph, path)
    return path


def _negated(graph):
    from mugraph.ir import KNode, TOp
    return ir.KernelGraph([KNode(TOp.NEG, (o,), None) for o in graph.outputs], graph.inputs,
                          graph.output_names)


def _traced(path):
    fn, args = load_function(f"{path}:f")
    return ir.from_jax(fn, *args)


def _file(folder, text):
    path = folder / f"user_{abs(hash(text)) % 10**8}.py"
    path.write_text(text)
    return path


# ---- cache faults --------------------------------------------------------------------------------
C = "cache fault"


case("cache folder is a file", C, check=lambda w: w, match="CacheWarning, a temporary folder")(
    lambda t: _warns_and_works(lambda: (t / "c").write_text("x"), t / "c"))
case("cache folder under a file", C, check=lambda w: w, match="CacheWarning, a temporary folder")(
    lambda t: _warns_and_works(lambda: (t / "f").write_text("x"), t / "f" / "cache"))
case("damaged result database", C, check=lambda w: w, match="CacheWarning, set aside, rebuilt")(
    lambda t: _warns_and_works(lambda: ((t / "d").mkdir(), (t / "d" / "results.sqlite")
                                        .write_bytes(b"garbage" * 200)), t / "d"))
case("damaged checkpoint", C, check=lambda state: state is None,
     match="CacheWarning, the search starts afresh")(lambda t: _damaged_checkpoint(t))
case("CPU harness cache is a file", C, check=lambda out: np.allclose(out, 2.0),
     match="CacheWarning, builds in a temporary folder")(lambda t: _harness_in_a_file(t))


def _warns_and_works(prepare, folder) -> bool:
    from mugraph.errors import CacheWarning
    from mugraph.search.cache import ResultCache
    prepare()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        store = ResultCache(folder)
        store.save_checkpoint("ab" * 32, b"x", "note")
        ok = store.checkpoint("ab" * 32)[1] == b"x"
    return ok and any(issubclass(c.category, CacheWarning) for c in caught)


def _damaged_checkpoint(folder):
    from mugraph.search.cache import ResultCache
    from mugraph.search.checkpoint import Checkpointer
    store = ResultCache(folder)
    store.save_checkpoint("cd" * 32, b"\x80\x04 not a pickle", "note")
    with pytest.warns(errors.CacheWarning, match="unreadable"):
        return Checkpointer(store, "cd" * 32).resume()


def _harness_in_a_file(folder):
    from mugraph.codegen.cpu import build_cpu
    (folder / "cpu").write_text("not a folder")
    source = '#include "tc_intrin.cuh"\nMG_GLOBAL void two(float* x) { x[threadIdx.x] = 2.0f; }\n'
    with pytest.warns(errors.CacheWarning, match="unusable"):
        module = build_cpu(source, "two", cache_dir=folder / "cpu", pch=False)
    x = np.zeros(32, np.float32)
    module.run("two", [x], 1, 32)
    return x


# ---- missing compilers -------------------------------------------------------------------------------
M = "missing compiler"
case("no g++ for the CPU harness", M, errors.CompileError, r"g\+\+ not found")(
    lambda t: _without_tools(t, lambda: __import__("mugraph.codegen.cpu", fromlist=["x"]).build_cpu(
        '#include "tc_intrin.cuh"\n// no g++ here\nMG_GLOBAL void k(float* x) { }\n', "k",
        cache_dir=t / "cpu")))
case("no g++ for the XLA FFI handler", M, errors.CompileError, r"g\+\+ not found")(
    lambda t: _without_tools(t, lambda: __import__("mugraph.jax_ffi", fromlist=["x"])
                             .build_handler(t / "ffi")))
case("neither NVRTC nor nvcc", M, errors.CompileError, r"neither NVRTC nor nvcc")(
    lambda t: _without_tools(t, lambda: __import__("mugraph.codegen.compile", fromlist=["x"])
                             .compile_cuda("__global__ void k() {}", "sm_80", backend="nvcc")))
case("NVRTC asked for, not installed", M, errors.CompileError, r"NVRTC is not available")(
    lambda t: _without_nvrtc(lambda: __import__("mugraph.codegen.compile", fromlist=["x"])
                             .compile_cuda("__global__ void k() {}", "sm_80", backend="nvrtc")))


def _without_tools(folder, action):
    """Run `action` with an empty PATH (no g++, no nvcc) and no memoised compiler version."""
    from mugraph.codegen import compile as compile_module
    from mugraph.codegen import cpu
    old = os.environ["PATH"]
    os.environ["PATH"] = str(folder)
    cpu._compiler_version.cache_clear()
    compile_module._toolchain_version.cache_clear()
    try:
        return action()
    finally:
        os.environ["PATH"] = old
        cpu._compiler_version.cache_clear()
        compile_module._toolchain_version.cache_clear()


def _without_nvrtc(action):
    from mugraph.codegen import compile as compile_module
    real = compile_module._nvrtc_version
    compile_module._nvrtc_version = lambda: None
    try:
        return action()
    finally:
        compile_module._nvrtc_version = real


# ---- the test ------------------------------------------------------------------------------------
@pytest.mark.parametrize("c", CASES, ids=[f"{c.category}: {c.name}" for c in CASES])
def test_case(c: Case, tmp_path, monkeypatch):
    monkeypatch.setenv("MUGRAPH_CACHE_DIR", str(tmp_path / "mugraph-cache"))
    monkeypatch.setenv("MUGRAPH_PROGRESS", "0")
    if c.error is not None:
        with pytest.raises(c.error) as caught:
            c.run(tmp_path)
        assert re.search(c.match, str(caught.value)), str(caught.value)
        return
    value = c.run(tmp_path)
    assert c.check(value), value


def test_the_corpus_is_large_and_covers_every_category():
    assert len(CASES) >= 60
    assert {c.category for c in CASES} == {G, U, H, D, F, C, M}


def test_a_malformed_example_argument_file_prints_one_error_line_and_exits_2(tmp_path):
    path = _file(tmp_path, _ONE.format("5"))
    out = subprocess.run([sys.executable, "-m", "mugraph", "search", f"{path}:f", "--budget", "3"],
                         capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, MUGRAPH_CACHE_DIR=str(tmp_path / "cache")))
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    error = [line for line in out.stderr.splitlines() if line.startswith("mugraph: error")]
    assert len(error) == 1 and "f_args = 5 is a int" in error[0], out.stderr
    assert "hint: e.g. f_args = [jax.ShapeDtypeStruct" in out.stderr


def test_a_bad_command_prints_one_line_not_a_traceback():
    out = subprocess.run([sys.executable, "-m", "mugraph", "search", "lora", "--small", "--budget",
                          "nan"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "budget_seconds=nan" in out.stderr


if __name__ == "__main__":
    print("| # | category | case | outcome |\n|---|---|---|---|")
    for i, c in enumerate(CASES, 1):
        print(f"| {i} | {c.category} | {c.name} | {c.outcome} |")
