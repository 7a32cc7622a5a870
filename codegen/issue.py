"""Warp instructions one loop trip issues, by class, counted from the lowering: the loop's code as the renderer
emits it (its barriers included), each statement weighted by the trip counts of the loops around it.

A statement's instructions are what its calls and operators become, one warp instruction per thread-level
operation (every thread of a warp runs the same one):

* MMA: ``mg_mma_*`` (one mma.sync), ``mg_wgmma_*`` (one wgmma or its fence / commit).
* MUFU (the special-function unit): the calls ``CALLS`` lists with their MUFU share (``__expf`` is ex2 plus a
  multiply, ``mg_exp2`` the ex2 alone, ``rsqrtf`` one rsq, ...), and a floating-point division (an rcp and its refinement).
* FP32: floating-point operators, the FP32 part of those calls, conversions, shuffles.
* INT: the operators of address and index arithmetic (memory indices, ``const int`` lines), each distinct index
  expression of a statement once (common subexpressions), none where every operand is a constant once the loops
  with constant bounds unroll. Still an upper bound: ptxas also reuses across statements and hoists what does not
  change per trip.
* SHARED: shared-memory wavefronts (128 bytes each): an ldmatrix.xN is N, a 16-byte cp.async per lane 4, any
  other access to a shared buffer 1.
* COPY: global loads issued (cp.async, TMA), a subset of the memory pipe's work, counted apart.
* BARRIER: ``__syncthreads`` / named barriers / mbarrier waits, and cp.async group waits.

The counts are estimates of the SASS, not read from it: ``kernels_generated/*/report.md`` and ``cuobjdump`` give
the real instructions where a GPU toolchain ran.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Mapping

# (MUFU, FP32) per call of the device header's functions (codegen/runtime/tc_intrin.cuh and the snippets):
# __expf / __logf are one ex2 / lg2 and a multiply; the accurate libdevice routines (sqrtf, tanhf, erff) and the
# composites are estimates of their length.
CALLS = {
    "mg_exp": (1, 1), "mg_exp2": (1, 0), "mg_log": (1, 1), "mg_rsqrt": (1, 0), "mg_sqrt": (1, 4), "mg_tanh": (2, 8),
    "mg_erf": (1, 12), "mg_sigmoid": (2, 3), "mg_silu": (2, 4), "mg_gelu": (1, 14), "mg_pow": (2, 2),
    "mg_log1p": (1, 6), "mg_expm1": (1, 6), "mg_softplus": (2, 6),
    "mg_fmax": (0, 1), "mg_fmin": (0, 1), "mg_fabs": (0, 1), "mg_square": (0, 1), "mg_leaky_relu": (0, 2),
    "mg_isfinite": (0, 2), "mg_h2f": (0, 1), "mg_f2h": (0, 1), "mg_b2f": (0, 1), "mg_f2b": (0, 1),
    "mg_cast_f32": (0, 1), "mg_cast_f16": (0, 1), "mg_cast_bf16": (0, 1), "mg_shfl_xor": (0, 1),
    "mg_shfl_idx": (0, 1), "mg_pack2": (0, 1),
}
LDMATRIX = re.compile(r"\bmg_ldmatrix_x([124])")
COPY = re.compile(r"\bmg_cp_async16\w*\(|\bmg_tma_\w*\(")
MMA = re.compile(r"\bmg_mma_\w+\(|\bmg_wgmma\w*\(")
BARRIER = re.compile(r"\bmg_syncthreads\(\)|\bmg_bar_sync\(|\bmg_mbar_wait\(|\bmg_cp_async_wait_group\b")
CALL = re.compile(r"\b(mg_\w+)\(")
SHARED = re.compile(r"\bsm\d+[cd]?\b")  # the renderer names shared buffers sm<k> (c: this trip's stage, d: a copy's)
FLOAT_DIV = re.compile(r"/\s*(?!\d+(?![\d.eEf]))")   # a division by other than an integer literal
OPERATOR = re.compile(r"<<|>>|[-+*/%^&|](?!=)")


@dataclass(frozen=True)
class TripOps:
    """Warp instructions of one warp per loop trip, by class (module docstring); ``shared`` in wavefronts."""

    mma: float = 0.0
    mufu: float = 0.0
    fp32: float = 0.0
    int: float = 0.0
    shared: float = 0.0      # shared-memory wavefronts (128 bytes each)
    copies: float = 0.0
    barriers: float = 0.0
    shared_ops: float = 0.0  # shared-memory instructions other than the copies (ldmatrix, loads, stores)

    @property
    def issue(self) -> float:
        """Issue slots: every instruction takes one, whatever unit runs it."""
        return self.mma + self.mufu + self.fp32 + self.int + self.shared_ops + self.copies + self.barriers

    def __add__(self, other: "TripOps") -> "TripOps":
        return TripOps(*(a + b for a, b in zip(self._values(), other._values())))

    def scaled(self, k: float) -> "TripOps":
        return TripOps(*(a * k for a in self._values()))

    def _values(self) -> tuple:
        return (self.mma, self.mufu, self.fp32, self.int, self.shared, self.copies, self.barriers, self.shared_ops)


# ---- counting one statement -------------------------------------------------------------------------------------
ADDRESSED = re.compile(r"(?:\bsm\d+[cd]?|\bin\d+|\bp\d+|\bout\d+|\bmg_ws|\bmg_ctr|\))\s*\[")  # memory, not registers
ADDRESS_STATEMENT = re.compile(r"\bmg_mbar_\w+\(|\bmg_cp_async16|\bmg_ldmatrix|\bmg_st\d+\(|\bmg_ldcg\(|\bmg_tma_")
NUMBER = re.compile(r"\b\d+(?:\.\d*)?(?:e[-+]?\d+)?f?\b")


def _split_indices(text: str) -> tuple[list, str]:
    """(the index expressions of memory accesses, the text with every [...] removed). Indices of register arrays
    are constants once their loops unroll: they are dropped."""
    memory, out, depth, start, is_memory = [], [], 0, 0, False
    for k, ch in enumerate(text):
        if ch == "[":
            if depth == 0:
                start, is_memory = k + 1, bool(ADDRESSED.search(text[max(0, k - 12):k + 1]))
            depth += 1
            continue
        if ch == "]":
            depth -= 1
            if depth == 0 and is_memory:
                memory.append(text[start:k])
            continue
        if depth == 0:
            out.append(ch)
    return memory, "".join(out)


IDENT = re.compile(r"\b[A-Za-z_]\w*\b")
KEYWORDS = frozenset({"long", "int", "unsigned", "const", "float"})


def _runtime(expr: str, constants: frozenset) -> bool:
    """Whether ``expr`` depends on something other than literals and unrolled loops' counters."""
    return any(name not in constants and name not in KEYWORDS for name in IDENT.findall(NUMBER.sub("0", expr)))


def _index_ops(exprs: list[str], constants: frozenset) -> int:
    """Integer instructions of a statement's memory indices: each distinct runtime part once (``_address_ops``)."""
    parts = dict.fromkeys(" + ".join(_runtime_terms(e, constants)) for e in exprs)
    return sum(_sum_ops(p) for p in parts if p)


def _address_ops(expr: str, constants: frozenset) -> int:
    """Integer instructions of an address or index: its runtime terms' operators and the adds joining them; the
    constant terms of a sum are the load's or store's immediate offset (no instruction)."""
    return _sum_ops(" + ".join(_runtime_terms(expr, constants)))


def _declared_ops(expr: str, constants: frozenset) -> int:
    """Integer instructions of a value computed into a register: as an address, plus one add of the constant
    terms (an address takes them as its immediate offset; a register value needs the add)."""
    runtime = _runtime_terms(expr, constants)
    if not runtime:
        return 0
    return _sum_ops(" + ".join(runtime)) + (len(_terms(expr.strip())) > len(runtime))


def _sum_ops(expr: str) -> int:
    return len(OPERATOR.findall(expr))


def _runtime_terms(expr: str, constants: frozenset) -> list[str]:
    """The terms of ``expr``'s top-level sum (nested parenthesised sums flattened) that are not constants."""
    return [t for t in _terms(expr.strip().lstrip("&").strip()) if _runtime(t, constants)]


def _terms(expr: str) -> list[str]:
    """``expr`` as the terms of a sum: split at '+' outside parentheses when nothing outside them binds looser
    (a shift, a bitwise operator or a comparison keeps the expression whole)."""
    while expr.startswith("(") and _match_paren(expr, 0) == len(expr):
        expr = expr[1:-1].strip()
    if re.match(r"\((?:long long|int|unsigned)\)\s*[\w(]", expr):
        expr = expr[expr.index(")") + 1:].strip()
        if expr.startswith("(") and _match_paren(expr, 0) == len(expr):
            return _terms(expr)
    terms, depth, start = [], 0, 0
    for k, ch in enumerate(expr):
        depth += {"(": 1, ")": -1, "[": 1, "]": -1}.get(ch, 0)
        if depth:
            continue
        if ch in "^|&<>?=!," or (ch == "-" and k > start and expr[k - 1] not in "*/%(+- "):
            return [expr]
        if ch == "+":
            terms.append(expr[start:k].strip())
            start = k + 1
    terms.append(expr[start:].strip())
    return [s for t in terms for s in (_terms(t) if t.startswith("(") else [t])] if len(terms) > 1 else terms


def statement_ops(text: str, constants: frozenset = frozenset()) -> TripOps:
    """The warp instructions of one statement (no loop around it); ``constants``: the counters of the unrolled
    loops around it."""
    text = text.split("//")[0]
    if not text.strip():
        return TripOps()
    if INT_DECLARATION.match(text):  # index, offset and pointer definitions: integer work
        return TripOps(int=sum(_declared_ops(value, constants) for value in _declared_values(text)))
    index, rest = _split_indices(text)
    ldm = sum(int(n) for n in LDMATRIX.findall(text))
    copies = len(COPY.findall(text))
    touches = len(SHARED.findall(text)) if not (ldm or copies) else 0
    ops = TripOps(mma=len(MMA.findall(text)), shared=ldm + 4 * copies + touches, copies=copies,
                  barriers=len(BARRIER.findall(text)), int=_index_ops(index, constants),
                  shared_ops=len(LDMATRIX.findall(text)) + touches)
    if ADDRESS_STATEMENT.search(text):   # the addresses are integer work, the values stored floating-point
        addresses, stored = _address_args(rest)
        return ops + TripOps(int=sum(_address_ops(a, constants) for a in addresses)) + \
            _value_ops(", ".join(stored))
    return ops + _value_ops(rest)


def _value_ops(rest: str) -> TripOps:
    """MUFU and FP32 instructions of the value computation ``rest`` (memory indices removed)."""
    mufu = fp32 = 0.0
    for name in CALL.findall(rest):
        m, f = CALLS.get(name, (0, 0))
        mufu, fp32 = mufu + m, fp32 + f
    fp32 -= 2 * _packed_pairs(rest)   # two roundings and their packing: one F2FP.*.PACK_AB
    plain = NUMBER.sub("0", CALL.sub("(", rest))
    operators = len(OPERATOR.findall(plain))
    divisions = len(FLOAT_DIV.findall(plain))
    return TripOps(mufu=mufu + divisions, fp32=fp32 + operators + divisions)   # a division: rcp + 2 FMA


# mg_pack2(mg_f2h(a), mg_f2h(b)): ptxas emits one F2FP.F16.F32.PACK_AB (cvt.rn.f16x2.f32, sm_80+) for the pair (SASS
# read here: gqa's sm_90a kernel has 40 of them and no single conversion)
PACK2 = re.compile(r"\bmg_pack2\(")


def _packed_pairs(text: str) -> int:
    """How many ``mg_pack2`` calls of ``text`` pack two fp16 (or two bf16) roundings."""
    pairs = 0
    for m in PACK2.finditer(text):
        args = [a.strip() for a in _split_args(text[m.end():_match_paren(text, m.end() - 1) - 1])]
        pairs += len(args) == 2 and any(all(a.startswith(f"mg_f2{k}(") for a in args) for k in "hb")
    return pairs


GLOBAL_POINTER = re.compile(r"\b(?:p\d+|in\d+|mg_ws|mg_ctr|sm\d+[cd]?|bb_|a_)\b")
MBARRIER = re.compile(r"\s*mg_mbar_\w+\(")
INT_DECLARATION = re.compile(r"\s*(?:const int\b|int\b|const long long\b|MG_SPTR\(\w+\) const\b)")


def _declared_values(text: str) -> list[str]:
    """The initialisers of a declaration ``const int a = x, b = y``."""
    body = INT_DECLARATION.sub("", text, count=1)
    return [part.split("=", 1)[1] for part in _split_args(body) if "=" in part]


def _address_args(rest: str) -> tuple[list[str], list[str]]:
    """(address arguments, other arguments) of the call ``rest``: an address takes a buffer's address (``&``) or
    offsets a buffer or pointer parameter."""
    open_ = rest.find("(")
    args = _split_args(rest[open_ + 1:rest.rfind(")")]) if open_ >= 0 else [rest]
    if MBARRIER.match(rest):   # an mbarrier's address and its phase or byte count: all integer
        return args, []
    addresses = [a for a in args if a.strip().startswith("&") or
                 any(GLOBAL_POINTER.fullmatch(t) for t in _terms(a.strip()))]   # a pointer plus offsets
    return addresses, [a for a in args if a not in addresses]


def _split_args(text: str) -> list[str]:
    """``text`` split at commas outside parentheses and braces."""
    out, depth, start = [], 0, 0
    for k, ch in enumerate(text):
        depth += {"(": 1, ")": -1, "{": 1, "}": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            out.append(text[start:k])
            start = k + 1
    return out + [text[start:]]


# ---- the loop's statements and the loops around them ------------------------------------------------------------
FOR = re.compile(r"for\s*\(\s*int\s+(\w+)\s*=\s*([^;]+);\s*\w+\s*<\s*([^;]+);\s*(?:\+\+\w+|\w+\s*\+=\s*(\d+))\s*\)")


def _trips(head: re.Match) -> float:
    """A for loop's trip count where its bounds are numbers (a bound with runtime terms: its numeric span)."""
    def value(expr):
        nums = re.findall(r"-?\d+", expr)
        return int(nums[-1]) if nums and re.fullmatch(r"[\w\s*+()-]*", expr) else 0
    lo, hi, step = value(head.group(2)), value(head.group(3)), int(head.group(4) or 1)
    if re.search(r"[a-z_]", head.group(2)) and re.search(r"[a-z_]", head.group(3)):
        span = value(head.group(3)) - value(head.group(2))   # e.g. q = 2 * h; q < 2 * h + 2
        return max(1, span // step)
    return max(1, -(-(hi - lo) // step)) if hi > lo else 1


def count(code: str) -> TripOps:
    """The warp instructions of ``code`` (C statements, loops and blocks), loops weighted by their trips."""
    code = "\n".join(line for line in code.splitlines() if not line.lstrip().startswith("#"))
    total, _ = _block(code, 0, 1.0, frozenset())
    return total


def _block(code: str, i: int, weight: float, constants: frozenset) -> tuple[TripOps, int]:
    total = TripOps()
    while True:
        i = _skip(code, i)
        if i >= len(code):
            return total, i
        if code[i] == "}":
            return total, i + 1
        ops, i = _statement(code, i, weight, constants)
        total = total + ops


def _statement(code: str, i: int, weight: float, constants: frozenset) -> tuple[TripOps, int]:
    i = _skip(code, i)
    head = FOR.match(code, i)
    if head:   # a loop with numeric bounds unrolls: its counter is a constant in its body
        unrolled = not _runtime(head.group(2) + " " + head.group(3), constants)
        return _statement(code, head.end(), weight * _trips(head),
                          constants | {head.group(1)} if unrolled else constants)
    if code.startswith("{", i):
        return _block(code, i + 1, weight, constants)
    cond = re.match(r"(if|else if)\s*\(", code[i:])
    if cond:
        end = _match_paren(code, i + cond.end() - 1)
        ops = statement_ops(code[i + cond.end():end - 1], constants).scaled(weight)
        body, j = _statement(code, end, weight, constants)
        return ops + body, j
    if code.startswith("else", i):
        return _statement(code, i + 4, weight, constants)
    end = _statement_end(code, i)
    return statement_ops(code[i:end], constants).scaled(weight), end + 1


def _skip(code: str, i: int) -> int:
    while i < len(code):
        if code[i].isspace():
            i += 1
        elif code.startswith("//", i):
            j = code.find("\n", i)
            i = len(code) if j < 0 else j
        else:
            break
    return i


def _match_paren(code: str, i: int) -> int:
    """The index after the ')' matching the '(' at ``i``."""
    depth = 0
    for j in range(i, len(code)):
        depth += {"(": 1, ")": -1}.get(code[j], 0)
        if depth == 0:
            return j + 1
    return len(code)


def _statement_end(code: str, i: int) -> int:
    """The ';' ending the statement at ``i`` (braces of an initialiser and parentheses nest)."""
    depth = 0
    for j in range(i, len(code)):
        ch = code[j]
        if ch in "({":
            depth += 1
        elif ch in ")}":
            if depth == 0:
                return j - 1     # a block's close with no ';' before it
            depth -= 1
        elif ch == ";" and depth == 0:
            return j
    return len(code)


# ---- the rendered loop ------------------------------------------------------------------------------------------
def loop_code(lines: list[str]) -> str:
    """The body of the main loop (``for (int it ...)`` or the single iteration's block) in rendered kernel lines."""
    for k, line in enumerate(lines):
        if line.lstrip().startswith("for (int it = 0;") or "the loop's single iteration" in line:
            indent = len(line) - len(line.lstrip())
            body = []
            for later in lines[k + 1:]:
                if later.strip() == "}" and len(later) - len(later.lstrip()) == indent:
                    return "\n".join(body)
                body.append(later)
            return "\n".join(body)
    return ""


@lru_cache(maxsize=4096)
def trip_ops(bg, arch, stages: int, splits: int, path: str) -> TripOps:
    """One warp's instructions per loop trip of ``bg`` lowered at this plan (memoised): the loop the renderer
    emits, barriers placed as the kernel places them."""
    from mugraph.codegen.plan import lowered
    return ir_trip_ops(*lowered(bg, arch, stages, splits, path))


# ---- what one SM's loop trip costs ------------------------------------------------------------------------------
@dataclass(frozen=True)
class IssueUnits:
    """One SM's issue resources (codegen/calibration.json, per target): processing blocks, lanes per unit, the
    shared-memory width, a barrier's cost and the warps a scheduler needs to issue every clock."""

    subpartitions: int
    fp32_per_clk: int
    int32_per_clk: int
    mufu_per_clk: int
    smem_bytes_per_clk: int
    barrier_clk: int
    warps_to_fill_issue: int

    @classmethod
    def of(cls, constants) -> "IssueUnits":
        """From a record or mapping with the calibration table's names (``sm_subpartitions``, ``fp32_per_clk``...)."""
        get = constants.__getitem__ if isinstance(constants, Mapping) else lambda k: getattr(constants, k)
        return cls(int(get("sm_subpartitions")), *(int(get(k)) for k in (
            "fp32_per_clk", "int32_per_clk", "mufu_per_clk", "smem_bytes_per_clk", "barrier_clk",
            "warps_to_fill_issue")))


def trip_clocks(ops: TripOps, warps: int, ctas: int, u: IssueUnits) -> dict:
    """Clocks one SM spends per loop trip, by limiter, when ``ctas`` CTAs with ``warps`` warps in all run there
    at once, each warp issuing ``ops``. Warps share the processing blocks (a warp stays on one), each issuing one
    instruction per clock when it holds ``warps_to_fill_issue`` warps (fewer leave clocks idle) over its quarter
    of the FP32, integer and special-function lanes; shared-memory wavefronts are the SM's; a barrier's clocks are
    hidden by the other CTAs on the SM. The trip takes the largest of the units, plus the barriers."""
    q = -(-max(1, warps) // u.subpartitions)                # warps on the busiest processing block
    lane = 32 * u.subpartitions                             # a warp instruction over one block's lanes
    return {"issue": q * ops.issue / min(1.0, q / u.warps_to_fill_issue),
            "mufu": q * ops.mufu * lane / u.mufu_per_clk, "fp32": q * ops.fp32 * lane / u.fp32_per_clk,
            "int": q * ops.int * lane / u.int32_per_clk,
            "shared": max(1, warps) * ops.shared * 128 / u.smem_bytes_per_clk,
            "barriers": ops.barriers * u.barrier_clk / max(1, ctas)}


def trip_seconds(clocks: dict, clock_hz: float) -> float:
    """A trip's time from ``trip_clocks``: the busiest unit, plus the barriers."""
    return (max(v for k, v in clocks.items() if k != "barriers") + clocks["barriers"]) / clock_hz


def ir_trip_ops(ir, smem) -> TripOps:
    """``trip_ops`` of an IR already lowered and placed."""
    from mugraph.codegen import render as R
    from mugraph.codegen.generate import Barriers
    body = R.CodeWriter()
    Barriers(ir, smem, body).render()
    return count(loop_code(body.lines))
