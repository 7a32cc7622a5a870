"""The `mugraph` command line: show, verify, search, cache, bench, regen."""
from __future__ import annotations

import argparse
import sys

from mugraph.ir.errors import Interrupted, InvalidInput, MugraphError


def _load_program(target: str):
    """A workload name, a graph JSON file, or FILE.py:FUNCTION -> (name, spec graph, workload|None)."""
    from mugraph import ir, workloads
    if target in workloads.names():
        w = workloads.get(target)
        return target, w.spec(), w
    if target.endswith(".json"):
        return target, ir.load(target), None
    if ":" in target:
        from mugraph.api import load_function
        fn, args = load_function(target)
        return target, ir.from_jax(fn, *args), None
    raise MugraphError(f"cannot load {target!r}",
                       hint=f"give a workload ({', '.join(workloads.names())}), a graph .json file, "
                            "or FILE.py:FUNCTION")


def cmd_show(args) -> int:
    from mugraph import ir
    from mugraph.testing import assert_equivalent
    name, spec, w = _load_program(args.target)
    if args.svg:
        graph = w.reference() if w is not None else spec
        _write_svg(graph, args.svg, name)
    print(f"== {name}: the spec (traced from JAX) ==")
    print(spec)
    if w is not None:
        ref = w.reference()
        print(f"\n== {name}: the hand-written fused μGraph ==")
        print(ref)
        arrays = w.random_inputs(args.seed)
        want, got = ir.interpret(spec, arrays), ir.interpret(ref, arrays)
        print(f"\n== check on random inputs (seed {args.seed}, float64) ==")
        for i, (a, b) in enumerate(zip(want, got)):
            scale = max(float(abs(a).max()), 1e-30)
            print(f"  output {i}: max |spec - fused| / max|spec| = {abs(a - b).max() / scale:.3e}")
        assert_equivalent(spec, ref, arrays)
        print("  agree")
    return 0


def cmd_verify(args) -> int:
    from mugraph import verify
    name, spec, w = _load_program(args.target)
    if args.candidate is not None:
        candidate = _load_graph(args.candidate)
        mismatch = verify.interface_mismatch(spec, candidate)
        if mismatch:
            raise InvalidInput(f"{args.candidate} cannot be compared with {name}: {mismatch}",
                               hint="the candidate must read the spec's inputs (same names, "
                                    "shapes and dtypes) and write as many outputs")
        print(f"== {args.candidate} against {name} ==")
        report = verify.check(spec, candidate, seed=args.seed)
    elif w is None:
        raise InvalidInput(f"verify {args.target} needs a candidate graph to check against it",
                           hint=f"mugraph verify {args.target} CANDIDATE.json (a graph saved with "
                                "mugraph.ir.save, or the graph.json of mugraph search --out)")
    else:
        wl = w.small() if args.small else w
        report = verify.check(wl.spec(), wl.reference(), seed=args.seed)
    print(report)
    return 0 if report.equivalent else 1


def _load_graph(path: str):
    from mugraph import ir
    if not path.endswith(".json"):
        raise InvalidInput(f"candidate {path!r} is not a graph .json file",
                           hint="save a graph with mugraph.ir.save(graph, 'candidate.json')")
    return ir.load(path)


def cmd_regen(args) -> int:
    from mugraph.regen import regenerate
    names = args.workloads.split(",") if args.workloads else None
    log = print if args.verbose else None
    files = regenerate(args.root, names, check=args.check, search=getattr(args, "search", False), log=log)
    if args.check:
        for f in files:
            print(f"stale: {f}")
        print(f"{len(files)} stale file(s)" if files else "kernels_generated/ is up to date")
        return 1 if files else 0
    print(f"wrote {len(files)} files")
    return 0


def cmd_search(args) -> int:
    from mugraph.search.cached import cached_search
    from mugraph.search.executors import make_executor
    name, spec, w = _load_program(args.target)
    config = _search_config(args)
    if args.small and w is not None:
        spec = w.small().spec()
    if args.out:
        _prepare_out(args.out)          # a bad --out fails now, not after the search
    print(f"== {name}: the spec ==")
    print(spec)
    executor = make_executor(config.workers, args.executor, args.scheduler)
    extend = args.budget is not None
    _say_if_resuming(spec, config, args.no_cache, extend)
    print(f"\n== searching ({config.budget_seconds:.0f} s budget, target {config.target}, "
          f"{executor.name} executor) ==")
    try:
        answer = cached_search(spec, config, cache=not args.no_cache, executor=executor,
                               extend=extend)
    finally:
        executor.close()
    result = answer.result
    print("\n== the winning μGraph ==")
    print(result.best)
    print("\n== report ==")
    print(result.summary())
    print(answer.note)
    if args.out:
        _write_result(result, args.out, config)
    if args.svg:
        _write_svg(result.best, args.svg, name)
    return 0


def _write_svg(graph, path: str, name: str) -> None:
    """The graph's picture (plain SVG) written to `path`."""
    from pathlib import Path
    from mugraph.ir.picture import to_svg
    try:
        Path(path).write_text(to_svg(graph, title=name))
    except OSError as e:
        raise InvalidInput(f"cannot write the picture to {path!r}: {e.strerror}",
                           hint="give --svg a file in a folder you can write to") from None
    print(f"\nwrote the picture to {path}")


def _say_if_resuming(spec, config, no_cache: bool, extend: bool) -> None:
    """One line when a stopped run of the same search left a checkpoint to resume from, or a
    stored search is continued with a larger budget."""
    if no_cache:
        return
    import time
    from mugraph.search.cache import ResultCache, search_key
    from mugraph.search.cached import lookup
    store = ResultCache()
    key = search_key(spec, config)
    found = lookup(store, key, config, extend)
    row = store.checkpoint(key)
    if found.kind == "resume" and row is not None:
        saved, _, note = row
        print(f"\n== resuming the search stopped at {time.strftime('%H:%M:%S', time.localtime(saved))}"
              f" ({note}) ==")
    elif found.kind == "continue":
        print(f"\n== {found.note} ==")


def _search_config(args):
    """--budget and --target-gpu, else $MUGRAPH_SEARCH_SECONDS and $MUGRAPH_TARGET."""
    from mugraph.ir.settings import settings
    from mugraph.search import SearchConfig
    budget = settings.search_seconds if args.budget is None else args.budget
    gpu = settings.target if args.target_gpu is None else args.target_gpu
    return SearchConfig(budget_seconds=budget, target=gpu, workers=args.workers, seed=args.seed,
                        max_kernel_ops=args.max_kernel_ops)


def _prepare_out(folder: str):
    """The --out folder, created and known to be writable, or a typed error."""
    import os
    from pathlib import Path
    out = Path(folder)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise MugraphError(f"cannot create the output folder {folder!r}: {e.strerror}",
                           hint="give --out a folder you can write to") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise MugraphError(f"the output folder {folder!r} is not writable",
                           hint="give --out a folder you can write to")
    return out


def _write_result(result, folder: str, config) -> None:
    """The winner as graph JSON, its CUDA for the target's arch, and the report."""
    from mugraph import ir
    from mugraph.codegen import generate_cuda
    from mugraph.search.targets import get_target
    out = _prepare_out(folder)
    ir.save(result.best, out / "graph.json")
    files = ["graph.json"]
    if result.best.custom_ops():
        (out / "kernel.cu").write_text(generate_cuda(result.best, arch=get_target(config.target).arch))
        files.append("kernel.cu")
    (out / "report.txt").write_text(result.summary() + "\n")
    files.append("report.txt")
    print(f"\nwrote {', '.join(str(out / f) for f in files)}")


def cmd_cache(args) -> int:
    from mugraph.search.cache import ResultCache
    cache = ResultCache()
    if args.action == "list":
        entries = cache.entries()
        print(f"{len(entries)} result(s) in {cache.path}")
        for e in entries:
            when = _when(e.created)
            stop = _report_line(e.summary, "stop reason:").split(" after")[0]
            print(f"  {e.key[:12]}  {when}  {e.target:<5} {e.inputs}  {stop}")
        stored = {e.key for e in entries}
        for key, saved, note in cache.checkpoints():
            # a stored search its budget stopped keeps its checkpoint: a larger budget continues it
            what = "continuable" if key in stored else "checkpoint"
            print(f"  {what} {key[:12]}  {_when(saved)}  {note}")
        return 0
    if args.action == "show":
        if not args.key:
            raise MugraphError("cache show needs a key", hint="`mugraph cache list` shows the keys")
        entry = cache.find(args.key)
        from mugraph import ir
        print(f"key {entry.key}\nstored {_when(entry.created)} for {entry.target}, inputs "
              f"{entry.inputs}\nconfig {entry.config}\nversions {entry.versions}\n")
        print(ir.from_json(entry.graph))
        print("\n" + entry.summary)
        sources = cache.sources(entry.key)
        for arch, (source, cubin) in sorted(sources.items()):
            print(f"\n{arch}: {len(source.splitlines())} lines of CUDA, "
                  f"{'a CUBIN of %d bytes' % len(cubin) if cubin else 'no CUBIN'}")
        return 0
    count = cache.clear()
    removed = _clear_builds() if args.all else []
    print(f"removed {count} result(s) and the search checkpoints from {cache.path}"
          + (f"; build folders {', '.join(removed)}" if removed else ""))
    return 0


def _clear_builds() -> list[str]:
    """Remove the CPU-harness, NVRTC, CUBIN and FFI build folders under the cache folder."""
    import shutil
    from pathlib import Path
    from mugraph.settings import settings
    removed = []
    for name in ("cpu", "nvrtc", "cubin", "ffi"):
        folder = Path(settings.cache_dir) / name
        if folder.is_dir():
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(name)
    return removed


def _when(seconds: float) -> str:
    import time
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(seconds))


def _report_line(summary: str, prefix: str) -> str:
    return next((line for line in summary.splitlines() if line.startswith(prefix)), "")


def cmd_bench(args) -> int:
    if args.what == "search":
        from mugraph.bench_search import main as bench_search
        return bench_search(args.rest)
    if args.what == "models":
        from mugraph.bench_models import main as bench_models
        return bench_models(args.rest)
    raise MugraphError(f"unknown benchmark {args.what!r}",
                       hint="mugraph bench search, mugraph bench models; the others are scripts: "
                            "python bench/verify.py, python bench/gpu.py, python bench/abstract.py")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="mugraph", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("show", help="print a program's kernel graph (and a workload's fused μGraph)")
    p.add_argument("target")
    p.add_argument("--svg", default=None, metavar="FILE",
                   help="also draw the graph (a workload's fused μGraph) as SVG into FILE")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(run=cmd_show)
    p = sub.add_parser("verify", help="check a candidate graph against a spec (or a workload's "
                                      "fused μGraph against its spec)")
    p.add_argument("target", help="the spec: a workload name, a graph .json file, or "
                                  "FILE.py:FUNCTION")
    p.add_argument("candidate", nargs="?", default=None,
                   help="a graph .json to check against the spec (a workload's own fused μGraph "
                        "when left out)")
    p.add_argument("--small", action="store_true", help="use the reduced shapes")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(run=cmd_verify)
    p = sub.add_parser("search", help="search for the best verified μGraph of a program")
    p.add_argument("target", help="a workload name, a graph .json file, or FILE.py:FUNCTION")
    p.add_argument("--budget", type=float, default=None, help="seconds of search (default: $MUGRAPH_SEARCH_SECONDS, else 300); the winner's check at the real shapes comes on top")
    p.add_argument("--target-gpu", default=None, choices=("a100", "h100", "h200"),
                   help="GPU the cost model ranks for (default: $MUGRAPH_TARGET, else h100)")
    p.add_argument("--workers", type=int, default=1, help="processes (default 1: in-process)")
    p.add_argument("--executor", choices=("in-process", "process-pool", "dask"), default=None,
                   help="where tasks run (default: in-process for 1 worker, else a process pool)")
    p.add_argument("--scheduler", default=None,
                   help="Dask scheduler address (default: $MUGRAPH_DASK_SCHEDULER, else a local cluster)")
    p.add_argument("--max-kernel-ops", type=int, default=3, help="kernel ops per candidate (default 3)")
    p.add_argument("--out", default=None, help="write the winner's graph.json, kernel.cu and report.txt here")
    p.add_argument("--small", action="store_true", help="a workload at its reduced shapes")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--svg", default=None, metavar="FILE",
                   help="draw the winning μGraph as SVG into FILE")
    p.add_argument("--no-cache", action="store_true",
                   help="search afresh: neither read nor write the result cache")
    p.set_defaults(run=cmd_search)
    p = sub.add_parser("cache", help="the result cache: list, show KEY, clear [--all]")
    p.add_argument("action", choices=("list", "show", "clear"))
    p.add_argument("key", nargs="?", default=None, help="for show: a key or its first digits")
    p.add_argument("--all", action="store_true",
                   help="for clear: also remove the CPU-harness, NVRTC and CUBIN builds")
    p.set_defaults(run=cmd_cache)
    p = sub.add_parser("regen", help="rewrite kernels_generated/ (graph JSON, CUDA, reports)")
    p.add_argument("--root", default=None, help="output folder (default: kernels_generated/)")
    p.add_argument("--workloads", default=None, help="comma-separated subset")
    p.add_argument("--check", action="store_true", help="only report files that differ")
    p.add_argument("--search", action="store_true",
                   help="rerun the searches (fixed seed and state budget) for the searched/ winners")
    p.add_argument("-v", "--verbose", action="store_true")
    p.set_defaults(run=cmd_regen)
    p = sub.add_parser("bench", help="benchmarks: `mugraph bench search [--suite all] [--cases "
                                     "a,b]`, `mugraph bench models [--dims full] [--stack 32]`")
    p.add_argument("what", choices=("search", "models"))
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(run=cmd_bench)
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except Interrupted as e:
        return _stopped(e)
    except KeyboardInterrupt:
        print("\nmugraph: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`| head`): stop quietly, as other tools do
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except MugraphError as e:
        print(f"mugraph: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 2


def _stopped(e) -> int:
    """A search stopped by Ctrl-C or SIGTERM: its best verified kernel so far, one line, 130."""
    partial = e.result
    if partial is not None and partial.best is not None:
        print("\n== stopped: the best kernel verified so far ==")
        print(partial.best)
        if partial.estimate is not None:
            print(f"estimated {partial.estimate.seconds * 1e6:.2f} us")
    print(f"\nmugraph: {e}", file=sys.stderr)
    return 130


if __name__ == "__main__":
    sys.exit(main())
