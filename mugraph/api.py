"""The public entry points: `superoptimize`, `Kernel` and `jit`."""
from __future__ import annotations

import functools
import importlib.util
import warnings
from pathlib import Path

import jax
import numpy as np

from mugraph import ir
from mugraph.ir import KernelGraph
from mugraph.ir.errors import Interrupted, InvalidInput, MugraphError
from mugraph.program import Program  # noqa: F401  (what superoptimize returns for a whole layer)


class Kernel:
    """A found μGraph with its report, its CUDA source and ways to run it."""

    def __init__(self, graph: KernelGraph, spec: KernelGraph, result=None, target: str = "h100",
                 fn=None, origin: str = "", cache_key: str | None = None, store=None):
        self.graph = graph
        self.spec = spec
        self.result = result
        self.target = target
        self.fn = fn                   # a FlatFunction of the traced JAX function, if there was one
        self.origin = origin           # where the kernel came from: searched, cache, re-sized
        self.cache_key = cache_key
        self._store = store            # the ResultCache it came from (its generated sources)
        self._cuda = None
        self._runtime = None
        self._jax: dict = {}

    @property
    def report(self):
        """The search report: counts, stop reason, verification, estimate and speedup."""
        return None if self.result is None else self.result.report

    @property
    def speedup(self) -> float | None:
        """Estimated speedup over the XLA-like baseline (what jax.jit would launch), the headline;
        `result.speedup_vs_unfused` is the one over the unfused program. None without a search."""
        return None if self.result is None else self.result.speedup

    @property
    def slower_than_jax(self) -> bool:
        """Whether the kernel is estimated slower than the XLA-like baseline (what jax.jit would
        launch): `mugraph.jit` then runs the JAX function itself."""
        speedup = self.speedup
        return speedup is not None and speedup < 1.0

    def slower_note(self) -> str:
        """One line saying so, or "" (shown in the report and warned by superoptimize)."""
        if not self.slower_than_jax:
            return ""
        return (f"this kernel is estimated slower than jax.jit ({self.speedup:.2f}x against the "
                "XLA-like baseline): mugraph.jit runs the JAX function instead")

    @property
    def cuda_source(self) -> str:
        """The generated CUDA for the target's arch (from the cache entry when there is one)."""
        if self._cuda is None:
            from mugraph.codegen import generate_cuda
            from mugraph.search.targets import get_target
            arch = get_target(self.target).arch
            if self.cache_key is not None and self._store is not None:
                self._cuda = self._store.sources(self.cache_key).get(arch, (None,))[0]
            if self._cuda is None:
                self._cuda = generate_cuda(self.graph, arch=arch)
        return self._cuda

    def show(self, format: str = "text", path=None) -> str:
        """A picture of the μGraph: "text" (the kernel graph and each block's loop nest, plus
        the report; printed), "svg" (the kernel graph with every block graph nested: grid,
        imap/fmap tiles, the loop, accumulators, thread-level chains, omap) or "html" (the SVG
        above the text). Returns it; `path` also writes it to that file."""
        if format not in ("text", "svg", "html"):
            raise InvalidInput(f"unknown picture format {format!r}", hint="text, svg or html")
        text = str(self.graph)
        if self.result is not None:
            text += "\n\n" + self.result.summary()
        if self.origin:
            text += f"\n{self.origin}"
        if self.slower_note():
            text += f"\n{self.slower_note()}"
        from mugraph.ir.picture import to_html, to_svg
        picture = {"text": lambda: text, "svg": lambda: to_svg(self.graph),
                   "html": lambda: to_html(self.graph, text)}[format]()
        if path is not None:
            _write(path, picture)
        if format == "text":
            print(text)
        return picture

    def _repr_svg_(self) -> str:
        """Notebooks draw a Kernel as its picture."""
        from mugraph.ir.picture import to_svg
        return to_svg(self.graph)

    def run_reference(self, *arrays, cast: bool = False):
        """Run the μGraph with the reference interpreter (float64), anywhere.

        Returns an array for a single-output graph, else a list in output order. Inputs must
        have the kernel's dtypes (InvalidInput otherwise); `cast=True` converts them first."""
        return _single(ir.interpret(self.graph, self._inputs(arrays, cast)))

    def run_on_cpu(self, *arrays, cast: bool = False):
        """Run the generated CUDA on the CPU harness (slow; for testing the emitted kernel), generated
        for the target's arch (sm_90a's TMA + wgmma code for h100 / h200). Outputs and inputs as
        `run_reference`, in the kernel's own dtypes."""
        from mugraph.codegen import run_on_cpu
        from mugraph.search.targets import get_target
        arch = get_target(self.target).arch
        return _single(run_on_cpu(self.graph, self._inputs(arrays, cast), arch=arch))

    def _inputs(self, arrays, cast: bool) -> list:
        """The arrays as NumPy, checked against the kernel's inputs (count, shape, dtype)."""
        names, nodes = self.graph.input_names, self.graph.inputs
        if len(arrays) != len(nodes):
            raise InvalidInput(f"the kernel takes {len(nodes)} inputs {list(names)}, got "
                               f"{len(arrays)} arrays")
        out = []
        for name, node, a in zip(names, nodes, arrays):
            a = np.asarray(a)
            if a.shape != node.shape:
                raise InvalidInput(f"input {name!r} has shape {a.shape}, the kernel expects "
                                   f"{node.shape}", hint="superoptimize again for other shapes")
            if a.dtype != node.dtype.numpy:
                if not cast:
                    raise InvalidInput(f"input {name!r} has dtype {a.dtype}, the kernel expects "
                                       f"{node.dtype.value}",
                                       hint=f"convert it (x.astype('{node.dtype.value}')) or "
                                            "pass cast=True to convert every input")
                a = a.astype(node.dtype.numpy)
            out.append(a)
        return out

    def __call__(self, *arrays):
        """Launch on the GPU (CuPy, JAX or NumPy arrays); the output is a CuPy array (a list of
        them for several outputs), overwritten by the next call (see GpuKernel)."""
        if self._runtime is None:
            from mugraph.codegen.runtime_cupy import load_kernel
            self._runtime = load_kernel(self.graph, target=self.target)
        return _single(self._runtime(*arrays))

    def as_jax(self, backend: str = "auto"):
        """A JAX-traceable function of the kernel's inputs (an array for one output, else a tuple)
        that works inside `jax.jit`, under `jax.grad` (its backward is JAX's VJP of the spec) and
        `jax.vmap` (one kernel run per batch element).

        `backend`: "cuda" launches the CUBIN through XLA on its stream; "harness" runs the
        generated CUDA on the CPU harness through a host callback; "auto" picks "cuda" where JAX
        sees a GPU, else "harness". Outputs take the traced function's dtypes (an explicit cast
        where the IR kept a wider one)."""
        from mugraph.jax_integration import as_jax, resolve_backend
        backend = resolve_backend(backend)
        if backend not in self._jax:
            spec_fn = self.fn.run if self.fn is not None else None
            dtypes = self.fn.out_dtypes if self.fn is not None else None
            self._jax[backend] = as_jax(self, backend, spec_fn=spec_fn, out_dtypes=dtypes)
        return self._jax[backend]

    def __repr__(self) -> str:
        return f"Kernel({self.graph!r})"


def superoptimize(fn_or_graph, *example_args, config=None, target: str | None = None,
                  budget_seconds: float | None = None, progress=None, cache=True, executor=None):
    """Trace (if given a JAX function), search, verify, rank and wrap the winner.

    A function that lifts whole into one searchable region gives a `Kernel`. A larger function
    (a model layer: parameters as pytrees) gives a `mugraph.program.Program`: it is cut into
    regions, each searched alone (identical ones once), the parts mugraph cannot lift kept as
    JAX; it has Kernel's surface (`.report`, `.show()`, `.speedup`, `run_reference`,
    `run_on_cpu`, `as_jax`). A function with nothing to lift is one UnsupportedOp.

    `config`: a SearchConfig or a dict of its fields (without one, the budget is
    $MUGRAPH_SEARCH_SECONDS, default 300 s, and the target $MUGRAPH_TARGET, default h100);
    `target` ("a100", "h100", "h200") and `budget_seconds` override the config's (a program of
    regions splits the budget among its distinct regions). `cache`: True uses the result cache
    under `$MUGRAPH_CACHE_DIR` (an entry is re-verified before use), a folder another one, False
    searches afresh. `executor`: where a program's regions are searched (a
    `mugraph.search.executors` executor; default: by `config.workers`).
    `progress(counters, best_seconds, elapsed)` replaces the default progress display (a live
    line on a terminal, a log line every few seconds elsewhere); False turns it off.
    The budget is not in the cache key: a stored search of the same program and config serves
    when no budget is asked for (here or in `config`) or the one asked for is no larger; a larger
    one continues the stored search from its checkpoint (the kernel's `origin` says so)."""
    config_arg, config = config, make_config(config, target=target, budget_seconds=budget_seconds)
    if progress is False:
        progress = _silent
    plan = _plan(fn_or_graph, example_args)
    found = _build(plan, config, progress=progress, cache=cache, executor=executor, strict=True,
                   extend=budget_given(config_arg, budget_seconds))
    if isinstance(found, Kernel) and found.slower_note():
        warnings.warn(f"superoptimize: {found.slower_note()}", RuntimeWarning, stacklevel=2)
    return found


def _plan(fn_or_graph, example_args) -> tuple:
    """What to compile: ("kernel", spec, FlatFunction or None) for a graph or a function that
    lifts whole as one region, else ("program", Prepared). Traces the function; call it outside
    `jax.ensure_compile_time_eval()` (there a mask built inside the function arrives folded)."""
    if isinstance(fn_or_graph, KernelGraph) or not callable(fn_or_graph):
        return ("kernel", *_spec_of(fn_or_graph, example_args))
    from mugraph.program import prepare
    prepared = prepare(fn_or_graph, example_args)
    if prepared.single_region():
        try:
            return ("kernel", *_spec_of(fn_or_graph, example_args))
        except MugraphError:   # the front end takes only part of what a region takes (0-d)
            pass
    return ("program", prepared)


def _build(plan: tuple, config, *, progress=None, cache=True, executor=None, strict=True,
           extend: bool = False):
    """Search what `_plan` found: a Kernel, or a Program (`strict`: a program with nothing to
    lift is an error, else a Program that is all JAX). `extend`: a budget larger than a stored
    search's continues it (see `superoptimize`)."""
    store = _store(cache)
    if plan[0] == "kernel":
        from mugraph.search.cached import cached_search
        _, spec, flat = plan
        try:
            answer = cached_search(spec, config, cache=store or False, progress=progress,
                                   executor=executor, extend=extend)
        except Interrupted as stopped:
            raise Interrupted(str(stopped), _stopped_kernel(stopped.result, spec, config.target,
                                                            flat)) from None
        return Kernel(answer.result.best, spec, answer.result, config.target, fn=flat,
                      origin=answer.note, cache_key=answer.key, store=store)
    from mugraph.program import compile_program, no_region_error
    prepared = plan[1]
    if strict and not prepared.liftable():
        raise no_region_error(prepared)
    return compile_program(prepared, config, cache=store, executor=executor, progress=progress)


def budget_given(config, budget_seconds) -> bool:
    """Whether the caller asked for a budget (then a larger one than a stored search's continues
    it; without one, any stored result of the same search serves)."""
    if budget_seconds is not None or (config is not None and not isinstance(config, dict)):
        return True
    return isinstance(config, dict) and bool({"budget_seconds", "budget_states"} & set(config))


def _stopped_kernel(partial, spec, target: str, flat) -> Kernel:
    """The Kernel a stopped search leaves: its best structure verified so far (finite-field test
    at the reduced shapes, not checked at the real shapes), else the spec itself; `origin` says
    which and how far the search came."""
    if partial is not None and partial.best is not None:
        return Kernel(partial.best, spec, None, target, fn=flat, origin=partial.note)
    note = partial.note if partial is not None else "search stopped"
    return Kernel(spec, spec, None, target, fn=flat,
                  origin=f"{note}; nothing verified yet, so this kernel is the spec itself")


def _store(cache):
    """The ResultCache for `cache`: True (the default folder), a folder, a ResultCache, or None
    for False/None."""
    from pathlib import Path
    from mugraph.search.cache import ResultCache
    if cache is True:
        return ResultCache()
    if cache is False or cache is None:
        return None
    if isinstance(cache, ResultCache):
        return cache
    if isinstance(cache, (str, Path)):
        return ResultCache(cache)
    raise InvalidInput(f"cache must be True, False, a folder or a ResultCache, got "
                       f"{type(cache).__name__}")


def _write(path, text: str) -> None:
    from pathlib import Path
    try:
        Path(path).write_text(text)
    except OSError as e:
        raise InvalidInput(f"cannot write {str(path)!r}: {e.strerror}",
                           hint="give a path in a folder you can write to") from None


def _single(outputs: list):
    """One array for a single-output graph, else the list."""
    return outputs[0] if len(outputs) == 1 else outputs


def _silent(*args) -> None:
    return None


def make_config(config=None, *, target: str | None = None, budget_seconds: float | None = None):
    """A SearchConfig from None, a SearchConfig or a dict of its fields, with overrides."""
    from mugraph.search import SearchConfig
    from mugraph.ir.errors import SearchError
    if config is None:
        from mugraph.ir.settings import settings
        config = SearchConfig(budget_seconds=settings.search_seconds, target=settings.target)
    elif isinstance(config, dict):
        config = SearchConfig.from_json(_json_of(config))
    elif not isinstance(config, SearchConfig):
        raise InvalidInput(f"config must be a SearchConfig or a dict of its fields, got "
                           f"{type(config).__name__}",
                           hint="e.g. config={'budget_seconds': 60, 'max_kernel_ops': 2}")
    changes = {}
    if target is not None:
        changes["target"] = target
    if budget_seconds is not None:
        if isinstance(budget_seconds, bool) or not isinstance(budget_seconds, (int, float)):
            raise SearchError(f"budget_seconds={budget_seconds!r} must be a number of seconds")
        changes["budget_seconds"] = float(budget_seconds)
    return config.replace(**changes) if changes else config


def _json_of(fields: dict) -> str:
    import json
    try:
        return json.dumps(fields)
    except TypeError as e:
        raise InvalidInput(f"config dict is not plain data: {e}",
                           hint="give numbers, strings and lists of op names") from None


def _spec_of(fn_or_graph, example_args):
    """(spec graph, FlatFunction or None) from a KernelGraph or a JAX function and its args."""
    if isinstance(fn_or_graph, KernelGraph):
        if example_args:
            raise InvalidInput("superoptimize(graph) takes no example arguments",
                               hint="pass the graph alone, or a JAX function and its arguments")
        return fn_or_graph, None
    if callable(fn_or_graph):
        from mugraph.jax_integration import flatten_function
        return ir.from_jax(fn_or_graph, *example_args), flatten_function(fn_or_graph, example_args)
    raise InvalidInput(f"superoptimize takes a JAX function or a KernelGraph, got "
                       f"{type(fn_or_graph).__name__}")


def jit(fn=None, *, backend: str = "auto", config=None, target: str | None = None, cache=True,
        executor=None):
    """Compile `fn` on first call per input signature (shapes, dtypes, pytree) and run it inside
    JAX: the result works under `jax.jit`, `jax.grad` and `jax.vmap` (see Kernel.as_jax).

    Whole layers work: what mugraph cannot lift runs as JAX (a program of regions, see
    superoptimize; `wrapper.kernels` holds what was compiled, with its report), and what mugraph
    would make slower than jax.jit by its own estimate is not used (the JAX function runs).
    `backend="auto"` uses "cuda" where JAX sees a GPU and otherwise runs `fn` itself (one
    warning); "harness" runs the generated CUDA on the CPU harness; "cuda" requires a GPU.
    `config`, `target`, `cache` and `executor` are superoptimize's."""
    if fn is None:
        return functools.partial(jit, backend=backend, config=config, target=target, cache=cache,
                                 executor=executor)
    from mugraph.jax_integration import BACKENDS
    if backend not in BACKENDS:
        raise InvalidInput(f"unknown backend {backend!r}", hint=f"one of: {', '.join(BACKENDS)}")
    compiled = _Compiled(fn, backend, config, target, cache, executor)

    @functools.wraps(fn)
    def wrapper(*args):
        return compiled(*args)

    wrapper.kernels = compiled.kernels
    return wrapper


class _Compiled:
    """The kernels `jit` built for one function, by input signature."""

    def __init__(self, fn, backend: str, config, target: str | None, cache=True, executor=None):
        self.fn, self.backend, self.config, self.target = fn, backend, config, target
        self.cache, self.executor = cache, executor
        self.kernels: dict = {}
        self.warned = False

    def __call__(self, *args):
        from mugraph.jax_integration import jax_has_gpu
        backend = self.backend
        if backend == "auto":
            if not jax_has_gpu():
                if not self.warned:
                    warnings.warn("mugraph.jit: no GPU; running the JAX function instead "
                                  "(backend='harness' runs the generated CUDA on the CPU harness)",
                                  RuntimeWarning, stacklevel=3)
                    self.warned = True
                return self.fn(*args)
            backend = "cuda"
        leaves, in_tree = jax.tree_util.tree_flatten(args)
        for i, leaf in enumerate(leaves):
            if not (hasattr(leaf, "shape") and hasattr(leaf, "dtype")):
                raise InvalidInput(f"argument leaf {i} is a {type(leaf).__name__}, not an array",
                                   hint="mugraph.jit compiles functions of arrays; close over "
                                        "Python numbers instead of passing them")
        key = (in_tree, tuple((tuple(np.shape(x)), str(np.dtype(x.dtype))) for x in leaves))
        if key not in self.kernels:
            self.kernels[key] = self._compile(args)
        return _run_compiled(self.kernels[key], self.jitted, backend, args, leaves)

    @functools.cached_property
    def jitted(self):
        """jax.jit(fn): what runs where mugraph's kernel is estimated slower."""
        return jax.jit(self.fn)

    def _compile(self, args):
        specs = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), args)
        # one front end, one answer: trace here, as superoptimize does (under compile-time eval a
        # mask built inside fn would arrive as a folded constant array) ...
        plan = _plan(self.fn, specs)
        config = make_config(self.config, target=self.target)
        # ... and search eagerly (the search runs JAX itself: the float test against
        # jax.jit(fn)), not inside the trace of a jax.jit this call may sit in
        with jax.ensure_compile_time_eval():
            return _build(plan, config, cache=self.cache, executor=self.executor, strict=False)


def _run_compiled(found, jitted, backend: str, args, leaves):
    """Run what `jit` compiled: a Program as one JAX program, a Kernel through its custom call,
    or `jax.jit(fn)` where the kernel is estimated slower than it."""
    if not isinstance(found, Kernel):
        return found.as_jax(backend)(*args)
    if found.slower_than_jax:
        return jitted(*args)
    outs = found.as_jax(backend)(*leaves)
    outs = outs if isinstance(outs, tuple) else (outs,)
    return jax.tree_util.tree_unflatten(found.fn.out_tree, list(outs))


def load_function(spec: str):
    """`FILE.py:FUNCTION` -> (function, example args). The file defines FUNCTION and either
    `FUNCTION_args` / `EXAMPLE_ARGS` (a list of arrays or jax.ShapeDtypeStruct) for it."""
    path, _, name = spec.rpartition(":")
    if not path or not name:
        raise InvalidInput(f"{spec!r} is not FILE.py:FUNCTION")
    file = Path(path)
    if not file.is_file():
        raise InvalidInput(f"no such file {path!r}", hint="give a path to a Python file")
    module_spec = importlib.util.spec_from_file_location(f"mugraph_user_{file.stem}", file)
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except Exception as e:  # the user's file: report, do not crash
        raise MugraphError(f"importing {path} failed: {type(e).__name__}: {e}") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise InvalidInput(f"{path} has no function {name!r}")
    where = f"{name}_args" if getattr(module, f"{name}_args", None) is not None else "EXAMPLE_ARGS"
    args = getattr(module, where, None)
    example = f"e.g. {name}_args = [jax.ShapeDtypeStruct((16, 64), jnp.float16)]"
    if args is None:
        raise InvalidInput(f"{path} must define {name}_args (or EXAMPLE_ARGS): the example "
                           "arguments to trace it with", hint=example)
    if not isinstance(args, (list, tuple)):
        raise InvalidInput(f"{path}: {where} = {_short(args)} is a {type(args).__name__}, not a "
                           f"list of example arguments", hint=example)
    return fn, list(args)


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
