"""The persistent result cache: hits answer fast and are re-verified, damaged or wrong entries are
reported once and rebuilt, unusable folders fall back to a temporary one, several processes share
one database; the CPU-harness and NVRTC build caches survive damaged files."""
from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap
import time
import uuid
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mugraph
from mugraph import ir
from mugraph.errors import CacheWarning
from mugraph.ir import cache_dir
from mugraph.search import SearchConfig
from mugraph.search.cache import ResultCache, result_blob
from mugraph.search.cached import cached_search

CONFIG = SearchConfig(max_kernel_ops=1, budget_seconds=30)
ARGS = [jax.ShapeDtypeStruct((8, 32), jnp.float32)] * 2


def axpy(x, y):
    return x * 2.0 + y


@pytest.fixture
def cache_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("MUGRAPH_CACHE_DIR", str(tmp_path / "cache"))
    cache_dir.forget()
    yield tmp_path / "cache"
    cache_dir.forget()


def _quiet(*args):
    return None


def test_the_same_search_a_second_time_answers_from_the_cache_in_under_a_second(cache_folder):
    first = mugraph.superoptimize(axpy, *ARGS, config=CONFIG, progress=_quiet)
    assert first.origin.startswith("searched; stored")
    start = time.perf_counter()
    again = mugraph.superoptimize(axpy, *ARGS, config=CONFIG, progress=_quiet)
    seconds = time.perf_counter() - start
    assert again.origin.startswith("from cache entry") and "re-verified" in again.origin
    assert again.graph is first.graph and seconds < 1.0
    assert again.cuda_source == first.cuda_source
    other = mugraph.superoptimize(axpy, *ARGS, config=CONFIG.replace(max_block_ops=8),
                                  progress=_quiet)
    assert other.origin.startswith("searched"), "another config is another key"


def _spec():
    return ir.from_jax(axpy, *ARGS)


def test_numerically_equal_configs_and_other_budgets_share_one_key():
    from mugraph.search.cache import search_key
    spec, base = _spec(), SearchConfig(max_kernel_ops=2, budget_seconds=30, kernel_ops=("mul", "add"))
    same = [base.replace(budget_seconds=30.0), SearchConfig(max_kernel_ops=2.0, budget_seconds=30,
                                                            kernel_ops=["add", "mul", "add"]),
            base.replace(budget_seconds=5), base.replace(budget_states=10), base.replace(workers=2)]
    assert {search_key(spec, c) for c in same} == {search_key(spec, base)}
    assert base.replace(budget_seconds=30.0) == base and base.replace(budget_seconds=30.0).to_json() == \
        base.to_json()
    other = [base.replace(max_kernel_ops=3), base.replace(kernel_ops=("mul",)), base.replace(seed=1),
             base.replace(target="a100")]
    assert len({search_key(spec, c) for c in other} | {search_key(spec, base)}) == len(other) + 1


def test_the_cli_and_python_defaults_are_one_search_but_for_the_budget():
    from mugraph.api import make_config
    from mugraph.cli import _search_config
    from mugraph.search.cache import search_key
    import argparse
    args = argparse.Namespace(budget=60.0, target_gpu="h100", workers=1, seed=0, max_kernel_ops=3)
    cli, python = _search_config(args), make_config(None, target="h100")
    assert cli.budget_seconds == 60.0 and python.budget_seconds == 300.0
    assert search_key(_spec(), cli) == search_key(_spec(), python)


def test_a_smaller_budget_reuses_a_stored_search_and_a_larger_one_continues_it(cache_folder,
                                                                            monkeypatch):
    from mugraph.search import runner
    spec = _spec()
    small = SearchConfig(max_kernel_ops=2, budget_states=200, budget_seconds=60)
    first = cached_search(spec, small, progress=_quiet)
    assert first.result.report.stop_reason == "states"
    assert ResultCache().checkpoint(first.key) is not None, "kept: a larger budget continues it"
    for config, extend in ((small, True), (small.replace(budget_states=100), True),
                           (small.replace(budget_states=400, budget_seconds=90), False)):
        again = cached_search(spec, config, progress=_quiet, extend=extend)
        assert again.origin == "cache" and again.result.best is first.result.best
        assert "a 60 s / 200 state search stopped by states" in again.note
    visited, real = [], runner.run_task
    monkeypatch.setattr(runner, "run_task", lambda args: visited.append(real(args)) or visited[-1])
    more = cached_search(spec, small.replace(budget_states=400), progress=_quiet)
    assert more.origin == "search" and more.key == first.key
    assert f"continued the stored search {first.key[:12]} (stopped by states" in more.note
    assert more.result.report.resumed.startswith("continued the stored search")
    states_now = sum(counters.states for _, counters, _, _ in visited)
    assert first.result.report.states + states_now == more.result.report.states <= 400
    assert states_now < more.result.report.states - 150, "it went on, it did not start over"
    assert cached_search(spec, small.replace(budget_states=400), progress=_quiet).origin == "cache"


def test_the_python_default_budget_reuses_the_command_lines_shorter_search(cache_folder):
    """README: `mugraph search W --budget N` then `superoptimize(...)` with the default budget
    (300 s) answers from the cache; it does not search again for five minutes."""
    from mugraph import workloads
    from mugraph.cli import main
    from mugraph.search.cache import ResultCache
    assert main(["search", "rmsnorm_linear", "--small", "--budget", "3"]) == 0
    stored = ResultCache().entries()
    assert len(stored) == 1 and stored[0].stop_reason == "time"
    start = time.perf_counter()
    kernel = mugraph.superoptimize(workloads.get("rmsnorm_linear").small().spec(), progress=False)
    assert kernel.origin.startswith(f"from cache entry {stored[0].key[:12]}")
    assert "a 3 s / 2000000 state search stopped by time" in kernel.origin
    assert time.perf_counter() - start < 5.0


def _tamper(store, key, **fields):
    entry = store.load(key)
    store.store(dataclasses.replace(entry, **fields))


@pytest.mark.parametrize("reduced", [128, 16], ids=["real-shapes", "reduced-shapes"])
def test_an_entry_whose_winner_is_wrong_is_caught_by_reverification_and_rebuilt(cache_folder,
                                                                                 reduced):
    spec = _spec()
    config = CONFIG.replace(reduced_extent=reduced)
    good = cached_search(spec, config, progress=_quiet)
    where = "at the real shapes" if reduced == 128 else "of its structure at the reduced shapes"
    assert where in cached_search(spec, config, progress=_quiet).note
    wrong = ir.from_jax(lambda x, y: x * 3.0 + y, *ARGS)
    store = ResultCache()
    _tamper(store, good.key, graph=ir.to_json(wrong, indent=None),
            result=result_blob(dataclasses.replace(good.result, best=wrong)))
    with pytest.warns(CacheWarning, match="failed a fresh finite-field test"):
        again = cached_search(spec, config, cache=store, progress=_quiet)
    assert again.origin == "search" and again.result.best is good.result.best
    assert cached_search(spec, config, cache=store, progress=_quiet).origin == "cache"


@pytest.mark.parametrize("damage", [
    {"result": b"\x80\x04garbage"},
    {"graph": "{not json"},
    {"graph": ir.to_json(ir.from_jax(lambda x, y: x - y, *ARGS), indent=None)},
])
def test_an_unreadable_or_mismatched_entry_is_reported_once_and_rebuilt(cache_folder, damage):
    spec = _spec()
    store = ResultCache()
    key = cached_search(spec, CONFIG, cache=store, progress=_quiet).key
    _tamper(store, key, **damage)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cached_search(spec, CONFIG, cache=store, progress=_quiet).origin == "search"
        _tamper(store, key, **damage)
        assert cached_search(spec, CONFIG, cache=store, progress=_quiet).origin == "search"
    assert sum(issubclass(c.category, CacheWarning) for c in caught) == 1


def test_a_damaged_database_file_is_set_aside(cache_folder):
    cache_folder.mkdir(parents=True)
    (cache_folder / "results.sqlite").write_bytes(b"this is not a database" * 100)
    with pytest.warns(CacheWarning, match="unreadable"):
        answer = cached_search(_spec(), CONFIG, progress=_quiet)
    assert answer.origin == "search"
    assert list(cache_folder.glob("results.sqlite.damaged-*"))
    assert cached_search(_spec(), CONFIG, progress=_quiet).origin == "cache"


@pytest.mark.parametrize("shape", ["file", "read-only"])
def test_an_unusable_cache_folder_falls_back_to_a_temporary_one(tmp_path, monkeypatch, shape):
    folder = tmp_path / "cache"
    if shape == "file":
        folder.write_text("a file where the folder should be")
    else:
        folder.mkdir()
        folder.chmod(0o500)
        if _can_write(folder):
            pytest.skip("running as a user who can write anywhere")
    monkeypatch.setenv("MUGRAPH_CACHE_DIR", str(folder))
    cache_dir.forget()
    try:
        with pytest.warns(CacheWarning, match="unusable"):
            store = ResultCache()
        assert store.folder != folder and store.path.parent.is_dir()
    finally:
        folder.chmod(0o700) if folder.is_dir() else None
        cache_dir.forget()


def _can_write(folder) -> bool:
    try:
        (folder / "probe").write_text("x")
        return True
    except OSError:
        return False


_WRITER = textwrap.dedent("""
    import sys, time
    from mugraph.search.cache import Entry, ResultCache
    folder, me = sys.argv[1], int(sys.argv[2])
    store = ResultCache(folder)
    for i in range(40):
        key = f"{me:02x}{i:062x}"
        store.store(Entry(key, "spec", "x", "h100", "{}", "{}", time.time(), "graph",
                          bytes([me]) * 1000, f"writer {me} entry {i}"))
        shared = "ff" * 32
        store.store(Entry(shared, "spec", "x", "h100", "{}", "{}", time.time(), "graph",
                          bytes([me]) * 1000, f"writer {me}"))
        assert store.load(key).summary == f"writer {me} entry {i}"
        got = store.load(shared)
        assert got.result == bytes([got.result[0]]) * 1000, "a torn shared entry"
    print("ok")
""")


def test_several_processes_share_one_database(tmp_path):
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path), str(me)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for me in range(3)]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0 and out.strip() == "ok", err
    store = ResultCache(tmp_path)
    assert len(store.entries()) == 3 * 40 + 1


def test_cache_commands_list_show_and_clear(cache_folder, capsys):
    from mugraph.cli import main
    key = cached_search(_spec(), CONFIG, progress=_quiet).key
    assert main(["cache", "list"]) == 0
    out = capsys.readouterr().out
    assert key[:12] in out and "x:f32[8,32]" in out and "exhausted" in out
    assert main(["cache", "show", key[:8]]) == 0
    out = capsys.readouterr().out
    assert "custom k0" in out and "EQUIVALENT" in out
    assert main(["cache", "show", "abc"]) == 2
    assert "no entry" in capsys.readouterr().err
    assert main(["cache", "clear"]) == 0
    assert "removed 1 result" in capsys.readouterr().out
    assert ResultCache().entries() == []


def test_a_garbage_cpu_harness_build_is_rebuilt_not_fatal():
    from mugraph.codegen.cpu import build_cpu
    source = (f'#include "tc_intrin.cuh"\n// {uuid.uuid4()}\nMG_GLOBAL void twice(float* x) '
              '{ x[threadIdx.x] *= 2.0f; }\n')
    # built in another process: this one must not have the library loaded under that name
    build = ("import sys; from mugraph.codegen.cpu import build_cpu; "
             "print(build_cpu(sys.stdin.read(), 'twice').path)")
    out = subprocess.run([sys.executable, "-c", build], input=source, capture_output=True,
                         text=True, timeout=120)
    so = Path(out.stdout.strip())
    assert out.returncode == 0 and so.is_file(), out.stderr
    so.write_bytes(b"")  # what a crash mid-write or a full disk leaves
    with pytest.warns(CacheWarning, match="rebuilding"):
        module = build_cpu(source, "twice")
    x = np.arange(32, dtype=np.float32)
    module.run("twice", [x], 1, 32)
    assert np.array_equal(x, np.arange(32, dtype=np.float32) * 2)


def test_a_damaged_nvrtc_cache_entry_is_compiled_again(tmp_path):
    from mugraph.codegen import compile as compile_module
    if compile_module._nvrtc_version() is None:
        pytest.skip("NVRTC is not installed")
    source = '#include "tc_intrin.cuh"\nMG_GLOBAL void k(float* x) { x[threadIdx.x] = 1.0f; }\n'
    first = compile_module.compile_cuda(source, "sm_80", cache_dir=tmp_path)
    compile_module.clear_memo()
    for meta in tmp_path.glob("*.json"):
        meta.write_text("{truncated")
    again = compile_module.compile_cuda(source, "sm_80", cache_dir=tmp_path)
    assert again.cubin == first.cubin and "k" in again.kernels


def _causal_softmax(keep):
    def f(q, k):
        s = q @ k.T
        rows, cols = jnp.arange(s.shape[0])[:, None], jnp.arange(s.shape[1])[None, :]
        return jax.nn.softmax(jnp.where(keep(rows, cols), s, -1e9), axis=-1)
    shape = jax.ShapeDtypeStruct((512, 64), jnp.float16)
    return ir.from_jax(f, shape, shape)


def test_a_stored_winner_over_an_iota_mask_is_re_verified_at_the_reduced_shapes():
    """A region whose mask is computed from iotas (gpt2's causal attention at 512 tokens): the
    cache's re-verification reads the iotas as inputs, as the search does, and re-sizes them with
    the rest (it raised ShapeError 'select of [512,512] and [128,128]' before, so a warm run lost
    the region); a winner with the mask the other way round fails the same test."""
    from mugraph.search.cached import reverify
    spec = _causal_softmax(lambda r, c: r >= c)
    assert reverify(spec, spec, SearchConfig()) == "of its structure at the reduced shapes"
    assert reverify(spec, _causal_softmax(lambda r, c: r <= c), SearchConfig()) is None
