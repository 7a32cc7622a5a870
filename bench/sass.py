"""Static SASS of the shipped kernels: instructions in each kernel and in its main loop, by class.

    .venv/bin/python bench/sass.py                       # this checkout's kernels_generated/
    .venv/bin/python bench/sass.py --tree /tmp/before    # another checkout (its kernels and runtime headers)

Each kernel_generated/<workload>/{kernel,searched/kernel}.sm_90.cu is compiled with NVRTC for sm_90 against the
runtime headers of the same tree and disassembled with cuobjdump. "loop" counts the instructions between the
target of the widest backward branch and that branch: the main loop's body as ptxas laid it out, which may
hold several trips if ptxas unrolled it (static counts, not a profile); "trips" is the loop's trip count per CTA
from the generated source, over all its splits ("-": no loop holds an MMA, and the class columns count the
whole kernel). Needs cuda-bindings, nvidia-cuda-nvrtc,
nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm (all in the test extras); no GPU.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

from mugraph.codegen.compile import _dump_sass  # noqa: E402

# Opcode classes, by the unit that issues them (the classes codegen/issue.py counts from the lowering).
CLASSES = (
    ("mma", ("HMMA", "HGMMA", "WARPGROUP")),
    ("mufu", ("MUFU",)),
    ("fp32", ("FADD", "FMUL", "FFMA", "FMNMX", "FSETP", "FSEL", "F2F", "F2FP", "HADD2", "HMUL2", "HFMA2", "FCHK")),
    ("shared", ("LDS", "STS", "LDSM", "STSM")),
    ("global", ("LDG", "STG", "LDGSTS", "LDGDEPBAR", "UTMALDG", "UTMASTG", "RED", "ATOM")),
    ("barrier", ("BAR", "SYNCS", "MEMBAR", "DEPBAR", "FENCE", "ARRIVES")),
)

_LINE = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P(?:T|\d+)\s+)?([A-Z][A-Z0-9_]*)(?:\.[A-Z0-9_.]+)?\s*([^;]*);",
                   re.MULTILINE)


def instructions(sass: str) -> list[tuple[int, str, str]]:
    """(address, opcode, operands) of every instruction, in order."""
    return [(int(a, 16), op, rest) for a, op, rest in _LINE.findall(sass)]


def main_loop(instrs: list[tuple[int, str, str]]) -> list[tuple[int, str, str]]:
    """The body of the main loop: of the backward branches' spans, the one holding the most MMA (the widest
    on a tie); [] when no loop holds an MMA (a kernel whose CTAs run one trip each, or one without MMA)."""
    best, best_key = [], (0, 0)
    for address, op, rest in instrs:
        m = re.search(r"0x([0-9a-f]+)", rest) if op == "BRA" else None
        if not m or int(m.group(1), 16) >= address:
            continue
        span = [i for i in instrs if int(m.group(1), 16) <= i[0] <= address]
        work = sum(1 for _, o, _ in span if o.startswith(("HMMA", "HGMMA")))
        key = (work, len(span))
        if work and key > best_key:
            best, best_key = span, key
    return best


def classify(instrs) -> Counter:
    counts = Counter()
    for _, op, _ in instrs:
        for name, prefixes in CLASSES:
            if op.startswith(prefixes):
                counts[name] += 1
                break
        else:
            counts["int/other"] += 1
    return counts


def compile_sm90(source: str, runtime: Path) -> bytes:
    from cuda.bindings import nvrtc
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), b"kernel.cu", 0, [], [])
    try:
        opts = [b"--gpu-architecture=sm_90", f"-I{runtime}".encode(), b"-std=c++17"]
        (result,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise SystemExit(f"NVRTC failed ({result.name})")
        err, size = nvrtc.nvrtcGetCUBINSize(prog)
        buf = b" " * size
        (err,) = nvrtc.nvrtcGetCUBIN(prog, buf)
        return buf
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, default=REPO, help="checkout to read (default: this one)")
    args = parser.parse_args(argv)
    root, runtime = args.tree / "kernels_generated", args.tree / "codegen" / "runtime"
    cols = ("mma", "mufu", "fp32", "shared", "global", "barrier", "int/other")
    print(f"{'workload':15} {'graph':9} {'kernel':>6} {'loop':>5} {'trips':>5}  " + " ".join(f"{c:>9}" for c in cols)
          + "   (loop body by class)")
    for workload in sorted(p.name for p in root.iterdir() if (p / "kernel.sm_90.cu").exists()):
        for graph, path in (("reference", root / workload / "kernel.sm_90.cu"),
                            ("searched", root / workload / "searched" / "kernel.sm_90.cu")):
            if not path.exists():
                continue
            source = path.read_text()
            instrs = instructions(_dump_sass(compile_sm90(source, runtime)))
            loop = main_loop(instrs)
            trips = max((int(n) for n in re.findall(r"forloop (\d+)", source)), default=1)
            counts = classify(loop or instrs)
            print(f"{workload:15} {graph:9} {len(instrs):6} {len(loop) if loop else '-':>5} {trips:5}  "
                  + " ".join(f"{counts[c]:9}" for c in cols))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
