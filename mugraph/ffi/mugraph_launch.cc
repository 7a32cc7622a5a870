// The XLA FFI handlers that launch a mugraph kernel from its NVRTC CUBIN on XLA's own stream.
//
// Modules are named by content: Python registers each CUBIN (and its PTX) under the SHA-256 of both
// (mg_register_module) and writes the pair to a registry folder (mg_set_registry); the custom call
// carries that name, so a persistent compilation cache or a serialized executable refers to the same
// code in every process. A process that has not registered a module loads it from the registry on
// first use, or fails with a message naming the module and the folder.
//
// Each call carries the kernel name, grid, block, dynamic shared memory and, per kernel parameter,
// what it is: operand i (kind 0), result i (kind 1) or workspace i (kind 2). Workspace (a split loop's
// partials and counters) is never an XLA value: `mugraph_launch_ws` takes it from XLA's scratch
// allocator for this call and zeroes the buffers the plan asks for with cuMemsetD8Async on XLA's
// stream. Plans without workspace go to `mugraph_launch`, which only launches kernels on buffers it
// is given: it is declared command-buffer compatible (XLA may capture it in a CUDA graph). A handler
// that allocates per call is not, by XLA's definition of the trait.
//
// The CUDA context is the one XLA's stream belongs to (cuStreamGetCtx). A module is loaded per
// context, at XLA's initialize stage (outside any graph capture) or on first launch: the CUBIN when
// it is for this GPU, else its PTX, compiled for this GPU by the driver's JIT. The driver is opened
// with dlopen, so building this file needs only jaxlib's FFI headers and g++ (no CUDA toolkit), and
// loading it needs no GPU.
#include <dlfcn.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

typedef int CUresult;
typedef struct CUctx_st* CUcontext;
typedef struct CUmod_st* CUmodule;
typedef struct CUfunc_st* CUfunction;
typedef struct CUstream_st* CUstream;
typedef unsigned long long CUdeviceptr;
typedef struct CUevent_st* CUevent;

namespace {

constexpr int kMaxDynamicSharedSizeBytes = 8;  // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
constexpr CUresult kNoBinaryForGpu = 209;      // CUDA_ERROR_NO_BINARY_FOR_GPU
constexpr int64_t kDefaultSharedBytes = 48 * 1024;
constexpr size_t kWorkspaceAlign = 256;         // like cudaMalloc: kernels copy 16-byte chunks
constexpr uint16_t kElfMachineCuda = 190;       // EM_CUDA

struct Driver {
  CUresult (*stream_get_ctx)(CUstream, CUcontext*) = nullptr;
  CUresult (*ctx_push)(CUcontext) = nullptr;
  CUresult (*ctx_pop)(CUcontext*) = nullptr;
  CUresult (*module_load_data)(CUmodule*, const void*) = nullptr;
  CUresult (*module_get_function)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*func_set_attribute)(CUfunction, int, int) = nullptr;
  CUresult (*memset_d8_async)(CUdeviceptr, unsigned char, size_t, CUstream) = nullptr;
  CUresult (*launch_kernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                            unsigned, CUstream, void**, void**) = nullptr;
  CUresult (*event_record)(CUevent, CUstream) = nullptr;
  CUresult (*get_error_string)(CUresult, const char**) = nullptr;
  std::string error;
};

template <typename F>
bool Bind(void* lib, const char* name, F* slot, std::string* error) {
  *slot = reinterpret_cast<F>(dlsym(lib, name));
  if (*slot == nullptr) *error = std::string("libcuda.so.1 has no ") + name;
  return *slot != nullptr;
}

const Driver& GetDriver() {
  static Driver driver = [] {
    Driver d;
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      d.error = std::string("cannot open the CUDA driver libcuda.so.1: ") + dlerror();
      return d;
    }
    Bind(lib, "cuStreamGetCtx", &d.stream_get_ctx, &d.error) &&
        Bind(lib, "cuCtxPushCurrent_v2", &d.ctx_push, &d.error) &&
        Bind(lib, "cuCtxPopCurrent_v2", &d.ctx_pop, &d.error) &&
        Bind(lib, "cuModuleLoadData", &d.module_load_data, &d.error) &&
        Bind(lib, "cuModuleGetFunction", &d.module_get_function, &d.error) &&
        Bind(lib, "cuFuncSetAttribute", &d.func_set_attribute, &d.error) &&
        Bind(lib, "cuMemsetD8Async", &d.memset_d8_async, &d.error) &&
        Bind(lib, "cuLaunchKernel", &d.launch_kernel, &d.error) &&
        Bind(lib, "cuEventRecord", &d.event_record, &d.error) &&
        Bind(lib, "cuGetErrorString", &d.get_error_string, &d.error);
    return d;
  }();
  return driver;
}

// ---- the registry of module images, by content hash ------------------------------------------------

struct Image {
  std::string cubin;
  std::string ptx;  // NUL-terminated for cuModuleLoadData
};

std::mutex registry_mutex;
std::string registry_dir;                                           // where images live on disk
std::map<std::string, Image> images;                                // by content hash
std::map<std::pair<std::string, CUcontext>, CUmodule> modules;      // loaded per context
std::map<std::tuple<CUmodule, std::string, int64_t>, CUfunction> functions;

bool IsCubin(std::string_view data) {
  if (data.size() < 20 || data.substr(0, 4) != std::string_view("\x7f" "ELF", 4)) return false;
  uint16_t machine = 0;
  std::memcpy(&machine, data.data() + 18, 2);
  return data[4] == 2 && machine == kElfMachineCuda;  // ELFCLASS64, EM_CUDA
}

bool IsHash(std::string_view name) {
  if (name.size() != 64) return false;
  for (char c : name)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

bool ReadFile(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream buffer;
  buffer << in.rdbuf();
  *out = buffer.str();
  return true;
}

// The image named `hash`: registered in this process, or read from the registry folder. Holds the lock.
const Image* FindImage(const std::string& hash, std::string* why) {
  auto it = images.find(hash);
  if (it != images.end()) return &it->second;
  if (!IsHash(hash)) {
    *why = "mugraph: module name '" + hash + "' is not a SHA-256 content hash (64 hex digits)";
    return nullptr;
  }
  Image image;
  std::string base = registry_dir + "/" + hash;
  if (registry_dir.empty() || !ReadFile(base + ".cubin", &image.cubin) ||
      !ReadFile(base + ".ptx", &image.ptx) || !IsCubin(image.cubin)) {
    *why = "mugraph: module " + hash + " is not loaded in this process and " +
           (registry_dir.empty() ? std::string("no registry folder is set")
                                 : "the registry " + registry_dir + " has no valid " + hash +
                                       ".cubin/.ptx") +
           "; run the kernel's as_jax('cuda') once in this process (it registers its CUBIN), or "
           "set MUGRAPH_CACHE_DIR to the cache of the process that compiled this program";
    return nullptr;
  }
  return &images.emplace(hash, std::move(image)).first->second;
}


std::string ErrorText(const Driver& d, CUresult rc) {
  const char* text = nullptr;
  if (d.get_error_string != nullptr) d.get_error_string(rc, &text);
  return text ? text : std::to_string(rc);
}

ffi::Error DriverError(const Driver& d, CUresult rc, const std::string& what) {
  return ffi::Error(ffi::ErrorCode::kInternal, "mugraph: " + what + " failed: " + ErrorText(d, rc));
}

// The image loaded in `ctx`: its CUBIN where the GPU runs it (an sm_90 CUBIN runs on 9.0 only), else
// its PTX, compiled for this GPU by the driver's JIT.
ffi::Error LoadModule(const Driver& d, const Image& image, CUcontext ctx, CUmodule* out) {
  if (CUresult rc = d.ctx_push(ctx)) return DriverError(d, rc, "cuCtxPushCurrent");
  CUresult cubin_rc = d.module_load_data(out, image.cubin.data()), ptx_rc = kNoBinaryForGpu;
  if (cubin_rc && !image.ptx.empty()) ptx_rc = d.module_load_data(out, image.ptx.c_str());
  CUcontext popped = nullptr;
  d.ctx_pop(&popped);
  if (cubin_rc && ptx_rc)
    return ffi::Error(ffi::ErrorCode::kInternal,
                      "mugraph: cuModuleLoadData failed for the CUBIN (" + ErrorText(d, cubin_rc) +
                          ") and for its PTX (" +
                          (image.ptx.empty() ? std::string("none registered") : ErrorText(d, ptx_rc)) +
                          ")");
  return ffi::Error::Success();
}

// The CUfunction for (module, kernel) in the stream's context, its shared-memory limit raised once.
ffi::Error GetFunction(const Driver& d, CUstream stream, std::string_view module_hash,
                       std::string_view kernel, int64_t smem, CUfunction* out) {
  CUcontext ctx = nullptr;
  if (CUresult rc = d.stream_get_ctx(stream, &ctx)) return DriverError(d, rc, "cuStreamGetCtx");
  std::lock_guard<std::mutex> lock(registry_mutex);
  std::string hash(module_hash);
  CUmodule& module = modules[{hash, ctx}];
  if (module == nullptr) {
    std::string why;
    const Image* image = FindImage(hash, &why);
    if (image == nullptr) return ffi::Error(ffi::ErrorCode::kNotFound, why);
    if (ffi::Error e = LoadModule(d, *image, ctx, &module); e.failure()) return e;
  }
  std::string name(kernel);
  CUfunction& fn = functions[{module, name, smem}];
  if (fn == nullptr) {
    if (CUresult rc = d.module_get_function(&fn, module, name.c_str()))
      return DriverError(d, rc, "cuModuleGetFunction(" + name + ")");
    if (smem > kDefaultSharedBytes) {
      if (CUresult rc = d.func_set_attribute(fn, kMaxDynamicSharedSizeBytes, static_cast<int>(smem)))
        return DriverError(d, rc, "cuFuncSetAttribute(max dynamic shared memory)");
    }
  }
  *out = fn;
  return ffi::Error::Success();
}

// ---- the handlers ---------------------------------------------------------------------------------

struct Call {
  std::string_view module;
  std::string_view kernel;
  ffi::Span<const int64_t> grid, block;
  int64_t smem;
  ffi::Span<const int64_t> param_kind, param_index;
};

ffi::Error CheckCall(const Driver& d, const Call& call) {
  if (!d.error.empty()) return ffi::Error(ffi::ErrorCode::kUnavailable, "mugraph: " + d.error);
  if (call.grid.size() != 3 || call.block.size() != 3)
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "mugraph: grid and block need 3 extents");
  if (call.param_kind.size() != call.param_index.size())
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      "mugraph: param_kind and param_index differ in length");
  return ffi::Error::Success();
}

// The kernel's parameter pointers: operands, results and this call's workspace.
ffi::Error Pointers(const Call& call, ffi::RemainingArgs& args, ffi::RemainingRets& rets,
                    const std::vector<void*>& workspace, std::vector<void*>* out) {
  out->resize(call.param_kind.size());
  for (size_t i = 0; i < call.param_kind.size(); ++i) {
    int64_t j = call.param_index[i];
    switch (call.param_kind[i]) {
      case 0: {
        auto buffer = args.get<ffi::AnyBuffer>(j);
        if (buffer.has_error()) return buffer.error();
        (*out)[i] = buffer->untyped_data();
        break;
      }
      case 1: {
        auto buffer = rets.get<ffi::AnyBuffer>(j);
        if (buffer.has_error()) return buffer.error();
        (*out)[i] = (*buffer)->untyped_data();
        break;
      }
      case 2:
        if (j < 0 || j >= static_cast<int64_t>(workspace.size()))
          return ffi::Error(ffi::ErrorCode::kInvalidArgument, "mugraph: no workspace " + std::to_string(j));
        (*out)[i] = workspace[j];
        break;
      default:
        return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                          "mugraph: unknown parameter kind " + std::to_string(call.param_kind[i]));
    }
  }
  return ffi::Error::Success();
}

ffi::Error Launch(const Driver& d, CUstream stream, const Call& call, std::vector<void*>& pointers) {
  std::vector<void*> slots(pointers.size());
  for (size_t i = 0; i < pointers.size(); ++i) slots[i] = &pointers[i];
  CUfunction fn = nullptr;
  if (ffi::Error e = GetFunction(d, stream, call.module, call.kernel, call.smem, &fn); e.failure())
    return e;
  CUresult rc = d.launch_kernel(fn, call.grid[0], call.grid[1], call.grid[2], call.block[0],
                                call.block[1], call.block[2], static_cast<unsigned>(call.smem),
                                stream, slots.data(), nullptr);
  if (rc) return DriverError(d, rc, "cuLaunchKernel(" + std::string(call.kernel) + ")");
  return ffi::Error::Success();
}

// Initialize stage (outside any command-buffer capture): load the module in the stream's context.
ffi::Error Prepare(CUstream stream, ffi::RemainingArgs, ffi::RemainingRets, std::string_view module,
                   std::string_view kernel, ffi::Span<const int64_t> grid,
                   ffi::Span<const int64_t> block, int64_t smem, ffi::Span<const int64_t> param_kind,
                   ffi::Span<const int64_t> param_index) {
  const Driver& d = GetDriver();
  Call call{module, kernel, grid, block, smem, param_kind, param_index};
  if (ffi::Error e = CheckCall(d, call); e.failure()) return e;
  CUfunction fn = nullptr;
  return GetFunction(d, stream, module, kernel, smem, &fn);
}

ffi::Error PrepareWorkspace(CUstream stream, ffi::RemainingArgs args, ffi::RemainingRets rets,
                            std::string_view module, std::string_view kernel,
                            ffi::Span<const int64_t> grid, ffi::Span<const int64_t> block,
                            int64_t smem, ffi::Span<const int64_t> param_kind,
                            ffi::Span<const int64_t> param_index, ffi::Span<const int64_t>,
                            ffi::Span<const int64_t>) {
  return Prepare(stream, args, rets, module, kernel, grid, block, smem, param_kind, param_index);
}

// Plans without workspace: operands and results only (command-buffer compatible).
ffi::Error Execute(CUstream stream, ffi::RemainingArgs args, ffi::RemainingRets rets,
                   std::string_view module, std::string_view kernel, ffi::Span<const int64_t> grid,
                   ffi::Span<const int64_t> block, int64_t smem, ffi::Span<const int64_t> param_kind,
                   ffi::Span<const int64_t> param_index) {
  const Driver& d = GetDriver();
  Call call{module, kernel, grid, block, smem, param_kind, param_index};
  if (ffi::Error e = CheckCall(d, call); e.failure()) return e;
  std::vector<void*> pointers;
  if (ffi::Error e = Pointers(call, args, rets, {}, &pointers); e.failure()) return e;
  return Launch(d, stream, call, pointers);
}

// Plans with workspace: this call's own buffers from XLA's scratch allocator, zeroed on XLA's stream
// where the plan says so. The allocator frees them when the handler returns; XLA orders that memory's
// next use after this stream's work.
ffi::Error ExecuteWorkspace(CUstream stream, ffi::ScratchAllocator scratch, ffi::RemainingArgs args,
                            ffi::RemainingRets rets, std::string_view module,
                            std::string_view kernel, ffi::Span<const int64_t> grid,
                            ffi::Span<const int64_t> block, int64_t smem,
                            ffi::Span<const int64_t> param_kind,
                            ffi::Span<const int64_t> param_index,
                            ffi::Span<const int64_t> workspace_bytes,
                            ffi::Span<const int64_t> workspace_zero) {
  const Driver& d = GetDriver();
  Call call{module, kernel, grid, block, smem, param_kind, param_index};
  if (ffi::Error e = CheckCall(d, call); e.failure()) return e;
  if (workspace_bytes.size() != workspace_zero.size())
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      "mugraph: workspace_bytes and workspace_zero differ in length");
  std::vector<void*> workspace(workspace_bytes.size());
  for (size_t i = 0; i < workspace.size(); ++i) {
    size_t bytes = static_cast<size_t>(workspace_bytes[i]);
    std::optional<void*> ptr = scratch.Allocate(bytes, kWorkspaceAlign);
    if (!ptr.has_value())
      return ffi::Error(ffi::ErrorCode::kResourceExhausted,
                        "mugraph: XLA's scratch allocator has no " + std::to_string(bytes) +
                            " bytes for " + std::string(kernel) + "'s workspace");
    workspace[i] = *ptr;
    if (workspace_zero[i]) {
      CUresult rc = d.memset_d8_async(reinterpret_cast<CUdeviceptr>(*ptr), 0, bytes, stream);
      if (rc) return DriverError(d, rc, "cuMemsetD8Async(workspace)");
    }
  }
  std::vector<void*> pointers;
  if (ffi::Error e = Pointers(call, args, rets, workspace, &pointers); e.failure()) return e;
  return Launch(d, stream, call, pointers);
}

// A timing mark: records `event` (a CUevent of XLA's context) on XLA's stream. Its results alias its
// operands (the caller declares it), so it moves no data: bracketing a program's inputs and outputs
// with two marks times exactly the device work between them.
ffi::Error RecordEvent(CUstream stream, ffi::RemainingArgs, ffi::RemainingRets, int64_t event) {
  const Driver& d = GetDriver();
  if (!d.error.empty()) return ffi::Error(ffi::ErrorCode::kUnavailable, "mugraph: " + d.error);
  if (CUresult rc = d.event_record(reinterpret_cast<CUevent>(event), stream))
    return DriverError(d, rc, "cuEventRecord");
  return ffi::Error::Success();
}

template <typename B>
auto WithCall(B binding) {
  return std::move(binding)
      .RemainingArgs()
      .RemainingRets()
      .template Attr<std::string_view>("module")
      .template Attr<std::string_view>("kernel")
      .template Attr<ffi::Span<const int64_t>>("grid")
      .template Attr<ffi::Span<const int64_t>>("block")
      .template Attr<int64_t>("smem")
      .template Attr<ffi::Span<const int64_t>>("param_kind")
      .template Attr<ffi::Span<const int64_t>>("param_index");
}

template <typename B>
auto WithWorkspace(B binding) {
  return std::move(binding)
      .template Attr<ffi::Span<const int64_t>>("workspace_bytes")
      .template Attr<ffi::Span<const int64_t>>("workspace_zero");
}

}  // namespace

// ---- the registry, from Python --------------------------------------------------------------------

// Registers an image under its content hash (computed by the caller: SHA-256 of CUBIN, NUL, PTX, as
// 64 hex digits). Returns 0, or -1 when `hash` is not a hash, -2 when `cubin` is not an ELF CUBIN.
extern "C" int64_t mg_register_module(const char* hash, const char* cubin, int64_t cubin_size,
                                      const char* ptx, int64_t ptx_size) {
  std::string name(hash);
  std::string_view data(cubin, static_cast<size_t>(cubin_size));
  if (!IsHash(name)) return -1;
  if (!IsCubin(data)) return -2;
  std::lock_guard<std::mutex> lock(registry_mutex);
  images.try_emplace(name, Image{std::string(data), std::string(ptx, static_cast<size_t>(ptx_size))});
  return 0;
}

extern "C" void mg_set_registry(const char* folder) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  registry_dir = folder;
}

// 1 when the module named `hash` is registered or readable from the registry (then it is kept);
// else 0, with the handler's own message in `why`.
extern "C" int64_t mg_find_module(const char* hash, char* why, int64_t why_size) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  std::string message;
  if (FindImage(hash, &message) != nullptr) return 1;
  if (why_size > 0) {
    size_t n = std::min(message.size(), static_cast<size_t>(why_size - 1));
    std::memcpy(why, message.data(), n);
    why[n] = '\0';
  }
  return 0;
}

extern "C" int64_t mg_module_count() {
  std::lock_guard<std::mutex> lock(registry_mutex);
  return static_cast<int64_t>(images.size());
}

// ---- the handler symbols --------------------------------------------------------------------------

XLA_FFI_DEFINE_HANDLER_SYMBOL(MugraphInitialize, Prepare,
                              WithCall(ffi::Ffi::BindInitialize().Ctx<ffi::PlatformStream<CUstream>>()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(MugraphLaunch, Execute,
                              WithCall(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<CUstream>>()),
                              {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(MugraphInitializeWorkspace, PrepareWorkspace,
                              WithWorkspace(WithCall(
                                  ffi::Ffi::BindInitialize().Ctx<ffi::PlatformStream<CUstream>>())));
XLA_FFI_DEFINE_HANDLER_SYMBOL(MugraphLaunchWorkspace, ExecuteWorkspace,
                              WithWorkspace(WithCall(ffi::Ffi::Bind()
                                                         .Ctx<ffi::PlatformStream<CUstream>>()
                                                         .Ctx<ffi::ScratchAllocator>())));
XLA_FFI_DEFINE_HANDLER_SYMBOL(MugraphRecordEvent, RecordEvent,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<CUstream>>()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attr<int64_t>("event"));
