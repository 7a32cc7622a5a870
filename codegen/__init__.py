"""CUDA code generation: kernel graphs to one ``.cu`` file plus a launch plan, compiled with NVRTC, tested on the
CPU harness (the CUDA CPU shim) and launched with CuPy on a GPU."""
from mugraph.codegen.compile import CompiledKernel, compile_cuda
from mugraph.codegen.generate import GeneratedModule, generate, generate_cuda
from mugraph.codegen.plan import (Buffer, KernelLaunch, LaunchPlan, SmemAlloc, SmemPlan,
                                  plan_shared_memory)
from mugraph.codegen.run_cpu import run_on_cpu
from mugraph.codegen.sample import run_sampled
from mugraph.codegen.schedule import KernelSchedule, kernel_schedule

__all__ = ["Buffer", "CompiledKernel", "GeneratedModule", "KernelLaunch", "KernelSchedule", "LaunchPlan",
           "SmemAlloc", "SmemPlan", "compile_cuda", "generate", "generate_cuda", "kernel_schedule",
           "plan_shared_memory", "run_on_cpu", "run_sampled"]
