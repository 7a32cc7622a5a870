"""NVRTC compilation (real NVRTC, ptxas and cuobjdump): the test kernels build for sm_80/sm_90 without spills and
with tensor-core SASS, resources are parsed, results are cached, failures carry an excerpt, the log and a repro."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from mugraph.codegen import compile as cc
from mugraph.codegen.compile import compile_cuda
from mugraph.ir.errors import CompileError, InvalidInput

KERNELS = Path(__file__).parent / "kernels"
GEMM_SOURCE = (KERNELS / "gemm_tc.cu").read_text()


def kernel_names(source: str) -> set[str]:
    return set(re.findall(r"MG_GLOBAL void (?:MG_LAUNCH_BOUNDS\([\w, ]+\)\s*)?(\w+)\(", source))


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_gemm_compiles_without_spills_to_tensor_core_sass(arch):
    kernel = compile_cuda(GEMM_SOURCE, arch, name="gemm_tc")
    assert set(kernel.kernels) == {"gemm_f16", "gemm_bf16"} and kernel.arch == arch
    for resources in kernel.kernels.values():
        assert resources.spills == 0 and resources.stack_bytes == 0
        assert 0 < resources.registers <= 128  # __launch_bounds__(128): room for 4 blocks per SM
    assert kernel.count("HMMA") == 2 * 2 * 8  # 2 kernels x 2 k16 steps x (2 x 4) mma per warp
    assert kernel.count("LDSM") > 0 and kernel.count("LDGSTS") > 0
    assert any(op.startswith("HMMA.16816.F32") for op in kernel.opcodes())
    assert kernel.cubin[:4] == b"\x7fELF" and ".target " + arch in kernel.ptx


def test_gemm_compiles_for_sm_90a():
    assert compile_cuda(GEMM_SOURCE, "sm_90a", name="gemm_tc").count("HMMA") > 0


@pytest.mark.parametrize("path", sorted(KERNELS.glob("*.cu")), ids=lambda p: p.name)
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_every_test_kernel_is_also_valid_cuda(path, arch):
    """The CPU harness's kernels are the same text NVRTC compiles, with no include path but the runtime folder."""
    source = path.read_text()
    kernel = compile_cuda(source, arch, name=path.stem)
    assert set(kernel.kernels) == kernel_names(source)


def test_register_pressure_spills_are_reported():
    unbounded = GEMM_SOURCE.replace("MG_LAUNCH_BOUNDS(THREADS)", "")  # __launch_bounds__ overrides maxrregcount
    kernel = compile_cuda(unbounded, "sm_80", name="gemm_tc", options=["--maxrregcount=32"])
    resources = kernel.resources("gemm_f16")
    assert resources.registers <= 32 and resources.spill_stores > 0 and resources.spill_loads > 0


def test_parse_ptxas_log_reads_each_entry():
    log = """ptxas info    : Compiling entry function 'k1' for 'sm_80'
ptxas info    : Function properties for k1
ptxas         .     8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 1536 bytes smem, 372 bytes cmem[0]
ptxas info    : Compiling entry function 'k2' for 'sm_80'
ptxas info    : Function properties for k2
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 10 registers, used 0 barriers, 360 bytes cmem[0]"""
    kernels = cc.parse_ptxas_log(log)
    assert kernels["k1"] == cc.KernelResources(registers=40, shared_bytes=1536, spill_stores=4, spill_loads=12,
                                               stack_bytes=8, barriers=1)
    assert kernels["k2"].shared_bytes == 0 and kernels["k2"].spills == 0


def test_results_are_memoised_in_process():
    first = compile_cuda(GEMM_SOURCE, "sm_80", name="gemm_tc")
    assert compile_cuda(GEMM_SOURCE, "sm_80", name="gemm_tc") is first
    assert compile_cuda(GEMM_SOURCE, "sm_80", name="gemm_tc", options=["-DUNUSED=1"]) is not first


def test_results_are_cached_on_disk(tmp_path):
    source = (KERNELS / "row_reduce.cu").read_text()
    first = compile_cuda(source, "sm_90", name="row_reduce", cache_dir=tmp_path)
    assert len(list(tmp_path.glob("*.cubin"))) == 1
    cc.clear_memo()
    again = compile_cuda(source, "sm_90", name="row_reduce", cache_dir=tmp_path)
    assert again is not first and again.cubin == first.cubin and again.kernels == first.kernels
    assert again.compile_seconds == first.compile_seconds  # read back, not recompiled


def test_compile_error_has_excerpt_log_and_repro():
    source = GEMM_SOURCE.replace("mg_cp_async_commit();", "mg_cp_async_comit();", 1)
    line = source[:source.index("mg_cp_async_comit")].count("\n") + 1
    with pytest.raises(CompileError) as info:
        compile_cuda(source, "sm_80", name="gemm_typo")
    error = info.value
    assert 'identifier "mg_cp_async_comit" is undefined' in error.log
    assert f"> {line:5d} |" in error.source_excerpt and "mg_cp_async_comit" in error.source_excerpt
    command = shlex.split(error.repro)
    assert command[:3] == ["nvcc", "-cubin", "-arch=sm_80"] and f"-I{cc.RUNTIME_DIR}" in command
    assert Path(command[-1]).read_text() == source
    assert error.log in str(error) and error.repro in str(error)


def test_unsupported_arch_names_the_supported_ones():
    with pytest.raises(InvalidInput, match=r"(?s)unsupported arch 'sm_70'.*sm_80, .*sm_90"):
        compile_cuda(GEMM_SOURCE, "sm_70")


@pytest.mark.parametrize("arch", ["sm_86", "sm_100", "sm_120"])
def test_the_gemm_builds_for_any_arch_nvrtc_supports(arch):
    """Not only the generator's arches: a launcher builds for the GPU present (codegen.device)."""
    if int(arch[3:]) not in cc.supported_archs():
        pytest.skip(f"this NVRTC builds no {arch}")
    kernel = compile_cuda(GEMM_SOURCE, arch, name="gemm_tc")
    assert kernel.arch == arch and f".target {arch}" in kernel.ptx and kernel.count("HMMA") > 0


def test_nvcc_fallback_gives_the_same_kernels():
    kernel = compile_cuda(GEMM_SOURCE, "sm_80", name="gemm_tc", backend="nvcc")
    nvrtc = compile_cuda(GEMM_SOURCE, "sm_80", name="gemm_tc")
    assert kernel.backend == "nvcc" and set(kernel.kernels) == set(nvrtc.kernels)
    assert kernel.resources("gemm_f16").spills == 0 and kernel.count("HMMA") == nvrtc.count("HMMA")


def test_missing_sass_tools_name_the_packages(monkeypatch):
    kernel = compile_cuda("extern \"C\" __global__ void empty() {}", "sm_80", name="empty")
    monkeypatch.setattr(cc, "find_tool", lambda name: None)
    cc._dump_sass.cache_clear()
    with pytest.raises(CompileError, match="nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm"):
        kernel.sass()
