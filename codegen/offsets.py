"""Per-thread offsets hoisted out of the unrolled loops in which each thread walks a tile (element e = tid + i * T):
where an index expression of e is, for every thread, its value at i = 0 plus i times one constant, the thread
computes the i = 0 value once, before the main loop, and each trip adds only constants (immediate offsets)."""
from __future__ import annotations

import functools
import itertools
import re

import numpy as np

_CAST = re.compile(r"\((?:long long|int|unsigned)\)")
_DIVIDE = re.compile(r"(?<![/])/(?![/])")
_NAME = re.compile(r"\b[A-Za-z_]\w*\b")


def evaluate(expr: str, name, values=None) -> np.ndarray | None:
    """``expr`` (a C integer expression) with ``name`` bound to ``values``, or with the names of the mapping
    ``name`` bound to its arrays (all non-negative: C's truncating division is Python's floor division there; the
    operators' precedence is the same in both); None where the expression names anything else."""
    env = dict(name) if values is None else {name: values}
    compiled = _compiled(expr)
    if compiled is None or compiled[0] - set(env):
        return None
    out = eval(compiled[1], {"__builtins__": {}, "_where": np.where}, env)  # noqa: S307 -- our index text, names checked
    shape = np.broadcast_shapes(*(np.shape(v) for v in env.values()))
    return np.broadcast_to(np.asarray(out, dtype=np.int64), shape)


@functools.lru_cache(maxsize=8192)
def _compiled(expr: str):
    """(the names ``expr`` reads, its Python code), or None where C and Python would read it apart (the same
    index texts come back for every candidate a search costs, so each is translated once)."""
    text = _python(_DIVIDE.sub("//", _CAST.sub("", expr)))
    if text is None:
        return None
    try:
        code = compile(text, "<index>", "eval")
    except SyntaxError:   # C that is not also Python: not hoisted
        return None
    return frozenset(_NAME.findall(_CAST.sub("", expr))), code


_COMPARE = re.compile(r"(?<![<>])[<>](?![<>])|[<>=!]=")
_BITWISE = re.compile(r"[&|^]")


def _python(expr: str) -> str | None:
    """``expr`` with C's conditionals as ``_where(cond, a, b)``; None where C and Python would group it apart (a
    comparison beside a bitwise operator at one level: C binds the comparison tighter, Python the bitwise op)."""
    out, k = [], 0
    while k < len(expr):
        if expr[k] == "(":
            depth, j = 0, k
            for j in range(k, len(expr)):
                depth += {"(": 1, ")": -1}.get(expr[j], 0)
                if depth == 0:
                    break
            inner = _python(expr[k + 1:j])
            if inner is None:
                return None
            out.append(f"({inner})")
            k = j + 1
        else:
            out.append(expr[k])
            k += 1
    text = "".join(out)
    level = re.sub(r"\([^()]*\)", "0", text)
    while re.search(r"\([^()]*\)", level):
        level = re.sub(r"\([^()]*\)", "0", level)
    if _COMPARE.search(level) and _BITWISE.search(level):
        return None
    return _conditional(text)


def _conditional(text: str) -> str:
    """A top-level ``c ? a : b`` (inner groups already converted) as ``_where(c, a, b)``."""
    depth, q = 0, -1
    for k, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "?" and depth == 0:
            q = k
            break
    if q < 0:
        return text
    depth, nested = 0, 0
    for k in range(q + 1, len(text)):
        ch = text[k]
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0 and ch == "?":
            nested += 1
        elif depth == 0 and ch == ":":
            if nested == 0:
                return f"_where({text[:q]}, {text[q + 1:k]}, {_conditional(text[k + 1:])})"
            nested -= 1
    return text


def trip_stride(expr: str, name: str, threads: int, trips: int, n: int) -> int | None:
    """The constant d with expr(tid + i * threads) == expr(tid) + i * d for every thread and trip whose element
    lies below ``n``; None where there is none (or the expression names more than ``name``)."""
    tid = np.arange(threads, dtype=np.int64)[None, :]
    trip = np.arange(trips, dtype=np.int64)[:, None]
    e = tid + trip * threads
    values = evaluate(expr, name, e)
    if values is None:
        return None
    if trips == 1:
        return 0
    d = values[1, 0] - values[0, 0]
    valid = e < n
    return int(d) if np.array_equal((values - values[0][None, :] - trip * d)[valid], np.zeros(valid.sum())) \
        else None


def at_thread(expr: str, name: str) -> str:
    """``expr`` at i = 0: the element index is the thread's own."""
    return re.sub(rf"\b{name}\b", "tid", expr)


# ---- the memory indices of a thread-strided loop's body --------------------------------------------------------
_SHARED_INDEX = re.compile(r"\bsm\d+c?\[")


def _indices(line: str) -> list[tuple[int, int]]:
    """(start, end) of each shared-memory index expression of ``line`` (the text between the brackets)."""
    out = []
    for m in _SHARED_INDEX.finditer(line):
        depth, start = 0, m.end()
        for k in range(start - 1, len(line)):
            depth += {"[": 1, "]": -1}.get(line[k], 0)
            if depth == 0:
                out.append((start, k))
                break
    return out


class ThreadBases:
    """Each thread's shared-memory offsets, computed once at kernel scope (``const int hK_ = ...``): an index
    that, for every thread, is one of them plus a constant reuses it (the constant is an immediate offset)."""

    def __init__(self, threads: int, decls: list[str]):
        self.threads, self.decls = threads, decls
        self.values: list[np.ndarray] = []
        self.names: list[str] = []

    def base(self, expr_at_tid: str, values: np.ndarray | None = None, exact: bool = False) -> tuple[str, int] | None:
        """(the variable, the constant) whose sum is ``expr_at_tid`` (a C expression of ``tid``, or of the names
        whose per-thread ``values`` are given) for every thread; a new variable where none differs from it by a
        constant (``exact``: by none)."""
        v = evaluate(expr_at_tid, "tid", np.arange(self.threads, dtype=np.int64)) if values is None else values
        if v is None:
            return None
        for name, w in zip(self.names, self.values):
            d = v - w
            if np.all(d == d[0]) and not (exact and d[0]):
                return name, int(d[0])
        name = f"h{len(self.names)}_"
        self.names.append(name)
        self.values.append(v)
        self.decls.append(f"const int {name} = {expr_at_tid};  // a thread's shared-memory offset, once")
        return name, 0


def hoist_strided(lines: list[str], bases: ThreadBases, threads: int, trips: int, n: int, name: str = "e_"):
    """``lines`` (the body of ``for i_ < trips: name = tid + i_ * threads``) with each shared-memory index of
    ``name`` alone that advances by a constant per trip rewritten as a kernel-scope base plus constants."""
    out = []
    for line in lines:
        pieces, last = [], 0
        for start, end in _indices(line):
            expr = line[start:end]
            d = trip_stride(expr, name, threads, trips, n) if re.search(rf"\b{name}\b", expr) else None
            found = bases.base(at_thread(expr, name)) if d is not None else None
            if found is None:
                continue
            var, c = found
            text = var + (f" + i_ * {d}" if d else "") + (f" + {c}" if c > 0 else f" - {-c}" if c else "")
            pieces += [line[last:start], text]
            last = end
        out.append("".join(pieces) + line[last:])
    return out


# ---- an index over unrolled counters: a thread's base, xor and plus constants -----------------------------------
def thread_env(threads: int, decls: dict) -> dict:
    """Per-thread values of ``tid``, ``lane``, ``warp`` and the kernel-scope names ``decls`` defines from them
    (name -> C expression), one entry per thread."""
    tid = np.arange(threads, dtype=np.int64)
    env = {"tid": tid, "lane": tid % 32, "warp": tid // 32}
    for name, expr in decls.items():
        value = evaluate(expr, env)
        if value is not None:
            env[name] = value
    return env


def xor_affine(expr: str, env: dict, counters: dict) -> tuple[np.ndarray, dict, dict] | None:
    """Where ``expr`` (over the per-thread names of ``env`` and the unrolled ``counters``, name -> trip count)
    equals (h ^ a) + b for every thread, with h its value at every counter 0 and a, b sums of a constant per unit
    of each counter: (h per thread, {counter: a's step}, {counter: b's step}); else None."""
    names = list(counters)
    grids = np.meshgrid(*(np.arange(counters[c], dtype=np.int64) for c in names), indexing="ij")
    combos = np.stack([g.ravel() for g in grids], axis=1) if names else np.zeros((1, 0), dtype=np.int64)
    full = {**env, **{c: combos[:, k][:, None] for k, c in enumerate(names)}}
    full = {k: (v[None, :] if v.ndim == 1 and k in env else v) for k, v in full.items()}
    values = evaluate(expr, full)
    if values is None:
        return None
    h = values[0]
    options = [_xor_plus(values[_unit(combos, k)], h) if counters[c] > 1 else [(0, 0)] for k, c in enumerate(names)]
    for choice in itertools.product(*options):
        a, b = (np.array([step[j] for step in choice], dtype=np.int64) for j in (0, 1))
        if np.array_equal((h[None, :] ^ (combos @ a)[:, None]) + (combos @ b)[:, None], values):
            return h, dict(zip(names, a.tolist())), dict(zip(names, b.tolist()))
    return None


def _unit(combos: np.ndarray, k: int) -> int:
    """The row of ``combos`` where counter k is 1 and the others 0."""
    target = np.zeros(combos.shape[1], dtype=np.int64)
    target[k] = 1
    return int(np.flatnonzero((combos == target).all(axis=1))[0])


def _xor_plus(v: np.ndarray, h: np.ndarray) -> list[tuple[int, int]]:
    """Every (a, b) with v == (h ^ a) + b at every thread, a below a power of two that divides b."""
    found = []
    for k in range(0, 24):
        low = (1 << k) - 1
        a = int((v[0] ^ h[0]) & low)
        b = int(v[0] - (h[0] ^ a))
        if b & low == 0 and np.array_equal((h ^ a) + b, v) and (a, b) not in found:
            found.append((a, b))
    return found


def render_xor_affine(base: str, a: dict, b: dict) -> str:
    """``(base ^ a) + b`` as C text, each of a and b a sum of counter x step."""
    def linear(step):
        return " + ".join(f"{c} * {s}" if s != 1 else c for c, s in step.items() if s)
    xa, pb = linear(a), linear(b)
    text = f"({base} ^ ({xa}))" if xa else base
    return f"{text} + {pb}" if pb else text


_INT_DECL = re.compile(r"^const int (.*?);")


def int_decls(lines: list[str]) -> dict:
    """name -> C expression of the ``const int`` definitions among kernel-scope ``lines``."""
    out = {}
    for line in lines:
        m = _INT_DECL.match(line)
        for part in m.group(1).split(", ") if m else []:
            name, _, expr = part.partition(" = ")
            out[name.strip()] = expr
    return out


def hoist_unrolled(expr: str, bases: ThreadBases, decls: list[str], counters: dict) -> str:
    """``expr`` (an index over per-thread kernel-scope names and the unrolled ``counters``) as a kernel-scope base
    computed once, xor and plus the counters' constants (``xor_affine``); unchanged where it is not of that form."""
    found = xor_affine(expr, thread_env(bases.threads, int_decls(decls)), counters)
    if found is None:
        return expr
    h, a, b = found
    at_zero = re.sub(rf"\b(?:{'|'.join(counters)})\b", "0", expr) if counters else expr
    var, _ = bases.base(at_zero, h, exact=True)
    return render_xor_affine(var, a, b)


def hoist_indices(text: str, bases: ThreadBases, decls: list[str], counters: dict, local: dict) -> tuple[str, bool]:
    """``text`` with each shared-memory index rewritten by ``hoist_unrolled`` after replacing the ``local`` names
    (name -> C expression over kernel-scope names and the counters); and whether every index was."""
    pieces, last, every = [], 0, True
    for start, end in _indices(text):
        expr = text[start:end]
        for name, value in local.items():
            expr = re.sub(rf"\b{name}\b", f"({value})", expr)
        hoisted = hoist_unrolled(expr, bases, decls, counters)
        if hoisted == expr:
            every = False
            continue
        pieces += [text[last:start], hoisted]
        last = end
    return "".join(pieces) + text[last:], every
