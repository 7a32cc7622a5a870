// The XLA FFI handler that launches a mugraph kernel from its NVRTC CUBIN on XLA's own stream.
//
// Python registers each CUBIN once (mg_register_module) and gets an id; the custom call carries the
// id, the kernel name, grid, block, dynamic shared memory and `params`: for each kernel parameter,
// the operand it is (i >= 0) or the result it is (-1 - i). The module is loaded per CUDA context on
// first use. The CUDA driver is opened with dlopen, so building this file needs only jaxlib's FFI
// headers and g++ (no CUDA toolkit), and loading it needs no GPU.
#include <dlfcn.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

typedef int CUresult;
typedef struct CUctx_st* CUcontext;
typedef struct CUmod_st* CUmodule;
typedef struct CUfunc_st* CUfunction;
typedef struct CUstream_st* CUstream;

namespace {

constexpr int kMaxDynamicSharedSizeBytes = 8;  // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
constexpr int64_t kDefaultSharedBytes = 48 * 1024;

struct Driver {
  CUresult (*ctx_get_current)(CUcontext*) = nullptr;
  CUresult (*module_load_data)(CUmodule*, const void*) = nullptr;
  CUresult (*module_get_function)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*func_set_attribute)(CUfunction, int, int) = nullptr;
  CUresult (*launch_kernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                            unsigned, CUstream, void**, void**) = nullptr;
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
    Bind(lib, "cuCtxGetCurrent", &d.ctx_get_current, &d.error) &&
        Bind(lib, "cuModuleLoadData", &d.module_load_data, &d.error) &&
        Bind(lib, "cuModuleGetFunction", &d.module_get_function, &d.error) &&
        Bind(lib, "cuFuncSetAttribute", &d.func_set_attribute, &d.error) &&
        Bind(lib, "cuLaunchKernel", &d.launch_kernel, &d.error) &&
        Bind(lib, "cuGetErrorString", &d.get_error_string, &d.error);
    return d;
  }();
  return driver;
}

std::mutex registry_mutex;
std::vector<std::string> cubins;                                    // by module id
std::map<std::pair<int64_t, CUcontext>, CUmodule> modules;          // loaded per context
std::map<std::tuple<CUmodule, std::string, int64_t>, CUfunction> functions;

ffi::Error DriverError(const Driver& d, CUresult rc, const std::string& what) {
  const char* text = nullptr;
  if (d.get_error_string != nullptr) d.get_error_string(rc, &text);
  return ffi::Error(ffi::ErrorCode::kInternal,
                    "mugraph: " + what + " failed: " + (text ? text : std::to_string(rc)));
}

// The CUfunction for (module, kernel) in the current context, its shared-memory limit raised once.
ffi::Error GetFunction(const Driver& d, int64_t module_id, std::string_view kernel, int64_t smem,
                       CUfunction* out) {
  CUcontext ctx = nullptr;
  if (CUresult rc = d.ctx_get_current(&ctx)) return DriverError(d, rc, "cuCtxGetCurrent");
  std::lock_guard<std::mutex> lock(registry_mutex);
  if (module_id < 0 || module_id >= static_cast<int64_t>(cubins.size()))
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      "mugraph: unknown module id " + std::to_string(module_id));
  CUmodule& module = modules[{module_id, ctx}];
  if (module == nullptr) {
    if (CUresult rc = d.module_load_data(&module, cubins[module_id].data()))
      return DriverError(d, rc, "cuModuleLoadData");
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

ffi::Error Launch(CUstream stream, ffi::RemainingArgs args, ffi::RemainingRets rets, int64_t module,
                  std::string_view kernel, ffi::Span<const int64_t> grid,
                  ffi::Span<const int64_t> block, int64_t smem, ffi::Span<const int64_t> params) {
  const Driver& d = GetDriver();
  if (!d.error.empty()) return ffi::Error(ffi::ErrorCode::kUnavailable, "mugraph: " + d.error);
  if (grid.size() != 3 || block.size() != 3)
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "mugraph: grid and block need 3 extents");
  std::vector<void*> pointers(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    int64_t p = params[i];
    if (p >= 0) {
      auto buffer = args.get<ffi::AnyBuffer>(p);
      if (buffer.has_error()) return buffer.error();
      pointers[i] = buffer->untyped_data();
    } else {
      auto buffer = rets.get<ffi::AnyBuffer>(-1 - p);
      if (buffer.has_error()) return buffer.error();
      pointers[i] = (*buffer)->untyped_data();
    }
  }
  std::vector<void*> slots(params.size());
  for (size_t i = 0; i < params.size(); ++i) slots[i] = &pointers[i];
  CUfunction fn = nullptr;
  if (ffi::Error e = GetFunction(d, module, kernel, smem, &fn); e.failure()) return e;
  CUresult rc = d.launch_kernel(fn, grid[0], grid[1], grid[2], block[0], block[1], block[2],
                                static_cast<unsigned>(smem), stream, slots.data(), nullptr);
  if (rc) return DriverError(d, rc, "cuLaunchKernel(" + std::string(kernel) + ")");
  return ffi::Error::Success();
}

}  // namespace

// A copy of the CUBIN, kept for the life of the process; returns its module id.
extern "C" int64_t mg_register_module(const char* data, int64_t size) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  cubins.emplace_back(data, static_cast<size_t>(size));
  return static_cast<int64_t>(cubins.size()) - 1;
}

extern "C" int64_t mg_module_count() {
  std::lock_guard<std::mutex> lock(registry_mutex);
  return static_cast<int64_t>(cubins.size());
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(MugraphLaunch, Launch,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<CUstream>>()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attr<int64_t>("module")
                                  .Attr<std::string_view>("kernel")
                                  .Attr<ffi::Span<const int64_t>>("grid")
                                  .Attr<ffi::Span<const int64_t>>("block")
                                  .Attr<int64_t>("smem")
                                  .Attr<ffi::Span<const int64_t>>("params"));
