"""What the launchers build for each GPU (codegen/device.py, no GPU needed): the code path per compute capability,
the arch each CUBIN is built for (the device's own with NVRTC where the generator's does not run), CUDA's binary
compatibility rules, plans re-made within a smaller GPU's shared memory, and the typed error where even that does
not fit; compile.py accepting every sm_XY NVRTC supports, with that GPU's limits."""
from __future__ import annotations

import pytest

from mugraph import workloads
from mugraph.codegen import compile as cc
from mugraph.codegen import device as dev
from mugraph.codegen.compile import compile_cuda, compile_target
from mugraph.ir.errors import InvalidInput, NoDevice, ResourceError

KB = 1024


@pytest.mark.parametrize("capability,codegen,binary", [
    ("8.0", "sm_80", "sm_80"), ("8.6", "sm_80", "sm_80"), ("8.9", "sm_80", "sm_80"),  # an sm_80 CUBIN runs on 8.x
    ("9.0", "sm_90a", "sm_90a"),                                                       # TMA + wgmma
    ("10.0", "sm_90", "sm_100"), ("10.3", "sm_90", "sm_103"), ("12.0", "sm_90", "sm_120"),
    ("12.1", "sm_90", "sm_121"),                                                       # NVRTC, the GPU's own arch
])
def test_each_gpu_gets_its_code_path_and_a_cubin_that_runs_on_it(capability, codegen, binary):
    d = dev.for_device(capability)
    assert (d.codegen, d.binary, d.jit) == (codegen, binary, False)
    assert dev.cubin_runs(d.binary, capability)


def test_a_gpu_newer_than_nvrtc_loads_the_ptx_and_says_so(monkeypatch):
    monkeypatch.setattr(dev, "supported_archs", lambda: (80, 90, 100))
    d = dev.for_device("12.0")
    assert d.jit and d.binary == "sm_90" and d.codegen == "sm_90"
    assert "JIT" in d.note() and "12.0" in d.note() and "sm_100" in d.note()


@pytest.mark.parametrize("arch,capability,runs", [
    ("sm_80", "8.0", True), ("sm_80", "8.6", True), ("sm_86", "8.0", False), ("sm_80", "9.0", False),
    ("sm_90", "9.0", True), ("sm_90a", "9.0", True), ("sm_90a", "10.0", False), ("sm_90", "10.0", False),
    ("sm_100", "10.3", True), ("sm_100a", "10.3", False), ("sm_120", "12.1", True), ("sm_121", "12.0", False),
])
def test_cubin_compatibility_follows_cuda_s_rules(arch, capability, runs):
    """Same major and a minor no newer; an arch-specific ('a') CUBIN on its own capability only."""
    assert dev.cubin_runs(arch, capability) is runs


def test_capabilities_parse_in_every_form_and_old_gpus_are_refused():
    assert {dev.parse_capability(c) for c in ("9.0", "90", 90, (9, 0), "sm_90a")} == {(9, 0)}
    assert dev.parse_capability("12.1") == (12, 1) and dev.parse_capability("sm_120") == (12, 0)
    with pytest.raises(InvalidInput, match="MAJOR.MINOR"):
        dev.parse_capability("ampere")
    with pytest.raises(NoDevice, match="compute capability 7.5.*8.0 or newer"):
        dev.for_device("7.5")


def test_the_device_limit_comes_from_the_table_or_the_device():
    assert dev.for_device("12.0").smem_limit == 99 * KB and dev.for_device("9.0").smem_limit == 227 * KB
    assert dev.for_device("8.6").smem_limit == 99 * KB and dev.for_device("8.0").smem_limit == 163 * KB
    assert dev.for_device("9.0", smem_limit=100_000).smem_limit == 100_000  # what the driver said wins


def test_compile_accepts_every_arch_nvrtc_supports_with_that_gpus_limits():
    assert compile_target("sm_120").max_smem_per_block == 99 * KB
    assert compile_target("sm_100a").max_smem_per_block == 227 * KB
    assert compile_target("sm_90a") is cc.TARGETS["sm_90a"]
    with pytest.raises(InvalidInput, match=r"(?s)unsupported arch 'sm_70'.*sm_80, sm_86"):
        compile_target("sm_70")
    with pytest.raises(InvalidInput, match="unsupported arch 'gfx90a'"):
        compile_cuda("", "gfx90a")


def test_a_generated_sm_90_kernel_builds_for_blackwell_gpus_the_cubin_naming_its_arch():
    module = dev.generate_for(workloads.get("lora").small().reference(), dev.for_device("12.0"))
    kernel = compile_cuda(module.source, "sm_120", name="lora")
    assert ".target sm_120" in kernel.ptx and kernel.arch == "sm_120"
    assert kernel.kernels and all(r.spills == 0 for r in kernel.kernels.values())


def test_a_smaller_gpu_gets_a_plan_within_its_shared_memory():
    """gqa's sm_90 plan keeps more stages in flight than an sm_120 block may hold; re-planned at 99 KB it fits."""
    graph = workloads.get("gqa").reference()
    at_227 = dev.generate_for(graph, dev.for_device("10.0")).plan.kernels[0].smem_bytes
    at_99 = dev.generate_for(graph, dev.for_device("12.0")).plan.kernels[0].smem_bytes
    assert at_227 > 99 * KB >= at_99, (at_227, at_99)


def test_a_kernel_that_fits_no_plan_is_a_typed_error_naming_it_its_bytes_and_the_limit():
    graph = workloads.get("gqa").reference()
    planned = dev.generate_for(graph, dev.for_device("10.0")).plan.kernels[0]
    tiny = dev.for_device("12.0", smem_limit=20_000)
    with pytest.raises(ResourceError) as info:
        dev.generate_for(graph, tiny)
    text = str(info.value)
    assert f"kernel '{planned.name}' plans {planned.smem_bytes} bytes" in text and "allows 20000" in text
    assert "compute capability 12.0" in text and "fewer pipeline stages do not fit" in text


def test_the_load_check_names_the_kernel_its_static_and_dynamic_bytes_and_the_limit():
    dev.check_shared_memory({"k0": 90 * KB, "k1": 60 * KB}, {"k0": 0, "k1": 8}, 99 * KB, "GPU 0")
    with pytest.raises(ResourceError, match=r"kernel 'k1' needs 2048 \+ 100000 = 102048 bytes.*GPU 1 .*allows 101376"):
        dev.check_shared_memory({"k0": 90 * KB, "k1": 100_000}, {"k1": 2048}, 99 * KB, "GPU 1 (12.0)")
