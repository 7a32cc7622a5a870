// The XLA FFI handlers that launch a mugraph kernel from its NVRTC CUBIN on XLA's own stream.
//
// Modules are named by content: Python registers each CUBIN (and its PTX) under the SHA-256 of both
// (mg_register_module) and writes the pair to a registry folder (mg_set_registry); the custom call
// carries that name, so a persistent compilation cache or a serialized executable refers to the same
// code in every process. A process that has not registered a module loads it from the registry on
// first use, or fails with a message naming the module and the folder.
//
// Each call carries the kernel name, grid, block (a TMA pipeline's producer warpgroup included),
// dynamic shared memory, the thread-block cluster, and per kernel parameter what it is: operand i
// (kind 0), result i (kind 1) or workspace i (kind 2). sm_90a kernels also take TMA tensor maps by
// value after those pointers: the call carries each map's compact description (`tensor_maps`, see
// TensorMapArgs: which buffer it views, then cuTensorMapEncodeTiled's arguments but the address), and
// the handler encodes the map at each launch for the address XLA hands over. A launch whose cluster is
// not (1, 1, 1) goes through cuLaunchKernelEx with the cluster dimension attribute, unless the kernel
// was compiled with __cluster_dims__ (then they must agree). Workspace (a split loop's partials and
// counters) is never an XLA value: `mugraph_launch_ws` takes it from XLA's scratch allocator for this
// call and zeroes the buffers the plan asks for with cuMemsetD8Async on XLA's stream. Plans without
// workspace go to `mugraph_launch`, which only launches kernels on buffers it is given: it is declared
// command-buffer compatible (XLA may capture it in a CUDA graph; the maps are encoded from the buffers
// of that call, as its pointers are). A handler that allocates per call is not, by XLA's definition of
// the trait.
//
// The CUDA context is the one XLA's stream belongs to (cuStreamGetCtx). A module is loaded per
// context, at XLA's initialize stage (outside any graph capture) or on first launch: the CUBIN when
// it runs on this GPU (Python builds it for the GPU's own arch with NVRTC), else its PTX, compiled
// for this GPU by the driver's JIT. Loading checks the kernel's shared memory against the GPU's
// per-block limit and names both. The driver is opened with dlopen, so building this file needs only
// jaxlib's FFI headers and g++ (no CUDA toolkit), and loading it needs no GPU; `mugraph_describe`
// (registered for the CPU) runs the same decoding on the CPU and reports what would be launched.
#include <dlfcn.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st* CUcontext;
typedef struct CUmod_st* CUmodule;
typedef struct CUfunc_st* CUfunction;
typedef struct CUstream_st* CUstream;
typedef unsigned long long CUdeviceptr;
typedef struct CUevent_st* CUevent;

// cuda.h's layouts for the structures this file hands the driver (CUDA 12 and 13 agree).
struct alignas(128) CUtensorMap {
  uint64_t opaque[16];
};
struct CUlaunchAttribute {
  int id;
  char pad[8 - sizeof(int)];
  union {
    char bytes[64];
    struct {
      unsigned x, y, z;
    } cluster_dim;
  } value;
};
struct CUlaunchConfig {
  unsigned grid_x, grid_y, grid_z, block_x, block_y, block_z, shared_mem_bytes;
  CUstream stream;
  CUlaunchAttribute* attrs;
  unsigned num_attrs;
};
static_assert(sizeof(CUlaunchAttribute) == 72, "CUlaunchAttribute is 72 bytes in cuda.h");
static_assert(sizeof(CUtensorMap) == 128, "CUtensorMap is 128 bytes in cuda.h");

namespace {

constexpr int kFuncSharedSizeBytes = 1;        // CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES
constexpr int kMaxDynamicSharedSizeBytes = 8;  // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
constexpr int kRequiredClusterWidth = 11;      // ... _HEIGHT 12, _DEPTH 13
constexpr int kNonPortableClusterSize = 14;    // CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED
constexpr int kDeviceSmemOptin = 97;           // CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
constexpr int kComputeMajor = 75, kComputeMinor = 76;  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_*
constexpr int kClusterDimension = 4;           // CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
constexpr CUresult kNoBinaryForGpu = 209;      // CUDA_ERROR_NO_BINARY_FOR_GPU
constexpr int64_t kDefaultSharedBytes = 48 * 1024;
constexpr size_t kWorkspaceAlign = 256;         // like cudaMalloc: kernels copy 16-byte chunks
constexpr uint16_t kElfMachineCuda = 190;       // EM_CUDA
constexpr int kPortableCluster = 8, kMaxCluster = 16;

// A tensor map's description in the `tensor_maps` attribute: kMapFields int64 per map, the same
// order as codegen/tma.py's TensorMapSpec.record() after (kind, index) of the buffer it views.
constexpr int kMaxRank = 5;
constexpr int kMapFields = 2 + 2 + 4 * kMaxRank + 4;

struct Driver {
  CUresult (*init)(unsigned) = nullptr;
  CUresult (*device_get)(CUdevice*, int) = nullptr;
  CUresult (*device_get_attribute)(int*, int, CUdevice) = nullptr;
  CUresult (*stream_get_ctx)(CUstream, CUcontext*) = nullptr;
  CUresult (*ctx_push)(CUcontext) = nullptr;
  CUresult (*ctx_pop)(CUcontext*) = nullptr;
  CUresult (*ctx_get_device)(CUdevice*) = nullptr;
  CUresult (*module_load_data)(CUmodule*, const void*) = nullptr;
  CUresult (*module_get_function)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*func_get_attribute)(int*, int, CUfunction) = nullptr;
  CUresult (*func_set_attribute)(CUfunction, int, int) = nullptr;
  CUresult (*memset_d8_async)(CUdeviceptr, unsigned char, size_t, CUstream) = nullptr;
  CUresult (*launch_kernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                            unsigned, CUstream, void**, void**) = nullptr;
  CUresult (*event_record)(CUevent, CUstream) = nullptr;
  CUresult (*get_error_string)(CUresult, const char**) = nullptr;
  // newer than the rest (CUDA 11.8, 12.0): bound when present, named in the error when used without
  CUresult (*launch_kernel_ex)(const CUlaunchConfig*, CUfunction, void**, void**) = nullptr;
  CUresult (*tensor_map_encode_tiled)(CUtensorMap*, int, uint32_t, void*, const uint64_t*,
                                      const uint64_t*, const uint32_t*, const uint32_t*, int, int,
                                      int, int) = nullptr;
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
    Bind(lib, "cuInit", &d.init, &d.error) && Bind(lib, "cuDeviceGet", &d.device_get, &d.error) &&
        Bind(lib, "cuDeviceGetAttribute", &d.device_get_attribute, &d.error) &&
        Bind(lib, "cuStreamGetCtx", &d.stream_get_ctx, &d.error) &&
        Bind(lib, "cuCtxPushCurrent_v2", &d.ctx_push, &d.error) &&
        Bind(lib, "cuCtxPopCurrent_v2", &d.ctx_pop, &d.error) &&
        Bind(lib, "cuCtxGetDevice", &d.ctx_get_device, &d.error) &&
        Bind(lib, "cuModuleLoadData", &d.module_load_data, &d.error) &&
        Bind(lib, "cuModuleGetFunction", &d.module_get_function, &d.error) &&
        Bind(lib, "cuFuncGetAttribute", &d.func_get_attribute, &d.error) &&
        Bind(lib, "cuFuncSetAttribute", &d.func_set_attribute, &d.error) &&
        Bind(lib, "cuMemsetD8Async", &d.memset_d8_async, &d.error) &&
        Bind(lib, "cuLaunchKernel", &d.launch_kernel, &d.error) &&
        Bind(lib, "cuEventRecord", &d.event_record, &d.error) &&
        Bind(lib, "cuGetErrorString", &d.get_error_string, &d.error);
    std::string optional;
    Bind(lib, "cuLaunchKernelEx", &d.launch_kernel_ex, &optional);
    Bind(lib, "cuTensorMapEncodeTiled", &d.tensor_map_encode_tiled, &optional);
    return d;
  }();
  return driver;
}

// ---- the registry of module images, by content hash ------------------------------------------------

struct Image {
  std::string cubin;
  std::string ptx;  // NUL-terminated for cuModuleLoadData
};

// A loaded kernel: its handle and the cluster shape it was compiled with (0, 0, 0: none).
struct Function {
  CUfunction fn = nullptr;
  unsigned compiled_cluster[3] = {0, 0, 0};
};

std::mutex registry_mutex;
std::string registry_dir;                                           // where images live on disk
std::map<std::string, Image> images;                                // by content hash
std::map<std::pair<std::string, CUcontext>, CUmodule> modules;      // loaded per context
std::map<std::tuple<CUmodule, std::string, int64_t, int64_t>, Function> functions;

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

ffi::Error Invalid(const std::string& what) {
  return ffi::Error(ffi::ErrorCode::kInvalidArgument, "mugraph: " + what);
}

// The image loaded in `ctx`: its CUBIN where the GPU runs it, else its PTX, compiled for this GPU by
// the driver's JIT.
ffi::Error LoadModule(const Driver& d, const Image& image, CUmodule* out) {
  CUresult cubin_rc = d.module_load_data(out, image.cubin.data()), ptx_rc = kNoBinaryForGpu;
  if (cubin_rc && !image.ptx.empty()) ptx_rc = d.module_load_data(out, image.ptx.c_str());
  if (cubin_rc && ptx_rc)
    return ffi::Error(ffi::ErrorCode::kInternal,
                      "mugraph: cuModuleLoadData failed for the CUBIN (" + ErrorText(d, cubin_rc) +
                          ") and for its PTX (" +
                          (image.ptx.empty() ? std::string("none registered") : ErrorText(d, ptx_rc)) +
                          ")");
  return ffi::Error::Success();
}

// The current context's GPU: its per-block shared-memory limit and compute capability.
ffi::Error DeviceLimits(const Driver& d, int* smem_optin, std::string* capability) {
  CUdevice device = 0;
  int major = 0, minor = 0;
  if (CUresult rc = d.ctx_get_device(&device)) return DriverError(d, rc, "cuCtxGetDevice");
  if (CUresult rc = d.device_get_attribute(smem_optin, kDeviceSmemOptin, device))
    return DriverError(d, rc, "cuDeviceGetAttribute(max shared memory per block, opt-in)");
  d.device_get_attribute(&major, kComputeMajor, device);
  d.device_get_attribute(&minor, kComputeMinor, device);
  *capability = std::to_string(major) + "." + std::to_string(minor);
  return ffi::Error::Success();
}

// Load-time checks and settings of one kernel: its shared memory fits the GPU (or a typed message
// naming the kernel, its bytes and the limit), its dynamic limit raised, its compiled cluster read.
ffi::Error PrepareFunction(const Driver& d, const std::string& name, int64_t smem, int64_t cluster_size,
                           Function* f) {
  int static_bytes = 0, optin = 0;
  std::string capability;
  if (CUresult rc = d.func_get_attribute(&static_bytes, kFuncSharedSizeBytes, f->fn))
    return DriverError(d, rc, "cuFuncGetAttribute(shared size)");
  if (ffi::Error e = DeviceLimits(d, &optin, &capability); e.failure()) return e;
  if (static_bytes + smem > optin)
    return ffi::Error(ffi::ErrorCode::kResourceExhausted,
                      "mugraph: kernel '" + name + "' needs " + std::to_string(static_bytes) + " + " +
                          std::to_string(smem) + " bytes of shared memory per block (static + dynamic); " +
                          "this GPU (compute capability " + capability + ") allows " +
                          std::to_string(optin) + ": search again for this GPU (a smaller tile)");
  if (smem > kDefaultSharedBytes) {
    if (CUresult rc = d.func_set_attribute(f->fn, kMaxDynamicSharedSizeBytes, static_cast<int>(smem)))
      return DriverError(d, rc, "cuFuncSetAttribute(max dynamic shared memory)");
  }
  for (int i = 0; i < 3; ++i) {
    int value = 0;
    if (d.func_get_attribute(&value, kRequiredClusterWidth + i, f->fn) == 0)
      f->compiled_cluster[i] = static_cast<unsigned>(value);
  }
  if (cluster_size > kPortableCluster) {
    if (CUresult rc = d.func_set_attribute(f->fn, kNonPortableClusterSize, 1))
      return DriverError(d, rc, "cuFuncSetAttribute(non-portable cluster size)");
  }
  return ffi::Error::Success();
}

// The kernel (module, name) in context `ctx`, loaded and checked once.
ffi::Error GetFunction(const Driver& d, CUcontext ctx, std::string_view module_hash,
                       std::string_view kernel, int64_t smem, int64_t cluster_size, Function* out) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  std::string hash(module_hash), name(kernel);
  CUmodule& module = modules[{hash, ctx}];
  auto key = std::make_tuple(module, name, smem, cluster_size);
  if (module != nullptr && functions.count(key)) {
    *out = functions[key];
    return ffi::Error::Success();
  }
  if (CUresult rc = d.ctx_push(ctx)) return DriverError(d, rc, "cuCtxPushCurrent");
  ffi::Error result = ffi::Error::Success();
  Function f;
  if (module == nullptr) {
    std::string why;
    const Image* image = FindImage(hash, &why);
    result = image == nullptr ? ffi::Error(ffi::ErrorCode::kNotFound, why) : LoadModule(d, *image, &module);
  }
  if (result.success()) {
    if (CUresult rc = d.module_get_function(&f.fn, module, name.c_str()))
      result = DriverError(d, rc, "cuModuleGetFunction(" + name + ")");
    else
      result = PrepareFunction(d, name, smem, cluster_size, &f);
  }
  CUcontext popped = nullptr;
  d.ctx_pop(&popped);
  if (result.failure()) return result;
  functions[std::make_tuple(module, name, smem, cluster_size)] = f;
  *out = f;
  return ffi::Error::Success();
}

// ---- a call's attributes, decoded -------------------------------------------------------------------

struct Call {
  std::string_view module;
  std::string_view kernel;
  ffi::Span<const int64_t> grid, block;
  int64_t smem;
  ffi::Span<const int64_t> param_kind, param_index, tensor_maps, cluster;

  int64_t ClusterSize() const { return cluster[0] * cluster[1] * cluster[2]; }
};

// cuTensorMapEncodeTiled's arguments for one map, and the buffer (kind, index) it views.
struct TensorMapArgs {
  int64_t kind = 0, index = 0;
  int dtype = 0;
  uint32_t rank = 0;
  uint64_t dims[kMaxRank] = {}, strides[kMaxRank] = {};  // strides: the rank - 1 outer ones, bytes
  uint32_t box[kMaxRank] = {}, element_strides[kMaxRank] = {};
  int interleave = 0, swizzle = 0, l2_promotion = 0, oob_fill = 0;
};

// Map `i` of the `tensor_maps` attribute; an error names what is out of range.
ffi::Error DecodeTensorMap(ffi::Span<const int64_t> all, size_t i, TensorMapArgs* out) {
  if (all.size() % kMapFields != 0)
    return Invalid("tensor_maps holds " + std::to_string(all.size()) + " values, not a multiple of " +
                   std::to_string(kMapFields));
  const int64_t* r = all.begin() + i * kMapFields;
  std::string map = "tensor map " + std::to_string(i) + ": ";
  TensorMapArgs a;
  a.kind = r[0];
  a.index = r[1];
  a.dtype = static_cast<int>(r[2]);
  if (r[3] < 1 || r[3] > kMaxRank) return Invalid(map + "rank " + std::to_string(r[3]) + " is not 1..5");
  a.rank = static_cast<uint32_t>(r[3]);
  if (a.kind < 0 || a.kind > 2) return Invalid(map + "unknown buffer kind " + std::to_string(a.kind));
  if (a.dtype < 0 || a.dtype > 15) return Invalid(map + "unknown data type " + std::to_string(a.dtype));
  const int64_t* dims = r + 4;
  const int64_t* strides = dims + kMaxRank;
  const int64_t* box = strides + kMaxRank;
  const int64_t* element = box + kMaxRank;
  for (uint32_t k = 0; k < a.rank; ++k) {
    if (dims[k] < 1 || dims[k] >= (int64_t(1) << 32)) return Invalid(map + "dim out of range");
    if (box[k] < 1 || box[k] > 256) return Invalid(map + "box extent out of 1..256");
    if (element[k] < 1 || element[k] > 8) return Invalid(map + "element stride out of 1..8");
    a.dims[k] = static_cast<uint64_t>(dims[k]);
    a.box[k] = static_cast<uint32_t>(box[k]);
    a.element_strides[k] = static_cast<uint32_t>(element[k]);
  }
  for (uint32_t k = 0; k + 1 < a.rank; ++k) {
    if (strides[k] <= 0 || strides[k] % 16 != 0) return Invalid(map + "stride not a positive multiple of 16");
    a.strides[k] = static_cast<uint64_t>(strides[k]);
  }
  const int64_t* enums = element + kMaxRank;
  a.interleave = static_cast<int>(enums[0]);
  a.swizzle = static_cast<int>(enums[1]);
  a.l2_promotion = static_cast<int>(enums[2]);
  a.oob_fill = static_cast<int>(enums[3]);
  if (a.swizzle < 0 || a.swizzle > 6 || a.interleave < 0 || a.interleave > 2 || a.l2_promotion < 0 ||
      a.l2_promotion > 3 || a.oob_fill < 0 || a.oob_fill > 1)
    return Invalid(map + "interleave, swizzle, L2 promotion or OOB fill out of range");
  *out = a;
  return ffi::Error::Success();
}

ffi::Error CheckCall(const Call& call) {
  if (call.grid.size() != 3 || call.block.size() != 3 || call.cluster.size() != 3)
    return Invalid("grid, block and cluster need 3 extents");
  if (call.param_kind.size() != call.param_index.size())
    return Invalid("param_kind and param_index differ in length");
  for (int i = 0; i < 3; ++i)
    if (call.cluster[i] < 1 || call.grid[i] % call.cluster[i] != 0)
      return Invalid("grid is not a whole number of clusters");
  if (call.ClusterSize() > kMaxCluster) return Invalid("a cluster holds at most 16 blocks");
  if (call.tensor_maps.size() % kMapFields != 0)
    return Invalid("tensor_maps holds " + std::to_string(call.tensor_maps.size()) +
                   " values, not a multiple of " + std::to_string(kMapFields));
  return ffi::Error::Success();
}

// The device address of buffer (kind, index): operand, result or this call's workspace.
ffi::Error Resolve(int64_t kind, int64_t j, ffi::RemainingArgs& args, ffi::RemainingRets& rets,
                   const std::vector<void*>& workspace, void** out) {
  switch (kind) {
    case 0: {
      auto buffer = args.get<ffi::AnyBuffer>(j);
      if (buffer.has_error()) return buffer.error();
      *out = buffer->untyped_data();
      return ffi::Error::Success();
    }
    case 1: {
      auto buffer = rets.get<ffi::AnyBuffer>(j);
      if (buffer.has_error()) return buffer.error();
      *out = (*buffer)->untyped_data();
      return ffi::Error::Success();
    }
    case 2:
      if (j < 0 || j >= static_cast<int64_t>(workspace.size()))
        return Invalid("no workspace " + std::to_string(j));
      *out = workspace[j];
      return ffi::Error::Success();
    default:
      return Invalid("unknown parameter kind " + std::to_string(kind));
  }
}

// What one launch passes: the pointer parameters, then each tensor map's encoding arguments.
struct Arguments {
  std::vector<void*> pointers;
  std::vector<TensorMapArgs> maps;
  std::vector<void*> map_addresses;
};

ffi::Error Gather(const Call& call, ffi::RemainingArgs& args, ffi::RemainingRets& rets,
                  const std::vector<void*>& workspace, Arguments* out) {
  out->pointers.resize(call.param_kind.size());
  for (size_t i = 0; i < call.param_kind.size(); ++i)
    if (ffi::Error e = Resolve(call.param_kind[i], call.param_index[i], args, rets, workspace,
                               &out->pointers[i]);
        e.failure())
      return e;
  size_t count = call.tensor_maps.size() / kMapFields;
  out->maps.resize(count);
  out->map_addresses.resize(count);
  for (size_t i = 0; i < count; ++i) {
    if (ffi::Error e = DecodeTensorMap(call.tensor_maps, i, &out->maps[i]); e.failure()) return e;
    if (ffi::Error e = Resolve(out->maps[i].kind, out->maps[i].index, args, rets, workspace,
                               &out->map_addresses[i]);
        e.failure())
      return e;
  }
  return ffi::Error::Success();
}

ffi::Error Encode(const Driver& d, const TensorMapArgs& a, void* address, CUtensorMap* out) {
  if (d.tensor_map_encode_tiled == nullptr)
    return ffi::Error(ffi::ErrorCode::kUnavailable,
                      "mugraph: this CUDA driver has no cuTensorMapEncodeTiled (TMA needs CUDA 12 and sm_90)");
  CUresult rc = d.tensor_map_encode_tiled(out, a.dtype, a.rank, address, a.dims, a.strides, a.box,
                                          a.element_strides, a.interleave, a.swizzle, a.l2_promotion,
                                          a.oob_fill);
  return rc ? DriverError(d, rc, "cuTensorMapEncodeTiled") : ffi::Error::Success();
}

// cuLaunchKernelEx with the cluster attribute where the call asks for a cluster the kernel was not
// compiled with; else cuLaunchKernel (a compiled cluster shape must be the call's).
ffi::Error Dispatch(const Driver& d, CUstream stream, const Call& call, const Function& f, void** params) {
  bool clustered = call.ClusterSize() > 1;
  bool compiled = f.compiled_cluster[0] != 0;
  if (compiled) {
    for (int i = 0; i < 3; ++i)
      if (static_cast<int64_t>(f.compiled_cluster[i]) != call.cluster[i])
        return Invalid("kernel " + std::string(call.kernel) + " was compiled for another cluster shape");
  }
  std::string name(call.kernel);
  if (!clustered || compiled) {
    CUresult rc = d.launch_kernel(f.fn, call.grid[0], call.grid[1], call.grid[2], call.block[0],
                                  call.block[1], call.block[2], static_cast<unsigned>(call.smem),
                                  stream, params, nullptr);
    return rc ? DriverError(d, rc, "cuLaunchKernel(" + name + ")") : ffi::Error::Success();
  }
  if (d.launch_kernel_ex == nullptr)
    return ffi::Error(ffi::ErrorCode::kUnavailable,
                      "mugraph: this CUDA driver has no cuLaunchKernelEx (clusters need CUDA 11.8)");
  CUlaunchAttribute attribute{};
  attribute.id = kClusterDimension;
  attribute.value.cluster_dim = {static_cast<unsigned>(call.cluster[0]),
                                 static_cast<unsigned>(call.cluster[1]),
                                 static_cast<unsigned>(call.cluster[2])};
  CUlaunchConfig config{static_cast<unsigned>(call.grid[0]),  static_cast<unsigned>(call.grid[1]),
                        static_cast<unsigned>(call.grid[2]),  static_cast<unsigned>(call.block[0]),
                        static_cast<unsigned>(call.block[1]), static_cast<unsigned>(call.block[2]),
                        static_cast<unsigned>(call.smem),     stream,
                        &attribute,                           1};
  CUresult rc = d.launch_kernel_ex(&config, f.fn, params, nullptr);
  return rc ? DriverError(d, rc, "cuLaunchKernelEx(" + name + ")") : ffi::Error::Success();
}

ffi::Error StreamContext(const Driver& d, CUstream stream, CUcontext* ctx) {
  CUresult rc = d.stream_get_ctx(stream, ctx);
  return rc ? DriverError(d, rc, "cuStreamGetCtx") : ffi::Error::Success();
}

// Encodes the maps and launches, with the stream's context current (whatever XLA's thread has).
ffi::Error Launch(const Driver& d, CUstream stream, const Call& call, ffi::RemainingArgs& args,
                  ffi::RemainingRets& rets, const std::vector<void*>& workspace) {
  Arguments a;
  if (ffi::Error e = Gather(call, args, rets, workspace, &a); e.failure()) return e;
  CUcontext ctx = nullptr;
  Function f;
  if (ffi::Error e = StreamContext(d, stream, &ctx); e.failure()) return e;
  if (ffi::Error e = GetFunction(d, ctx, call.module, call.kernel, call.smem, call.ClusterSize(), &f);
      e.failure())
    return e;
  if (CUresult rc = d.ctx_push(ctx)) return DriverError(d, rc, "cuCtxPushCurrent");
  std::vector<CUtensorMap> maps(a.maps.size());
  ffi::Error result = ffi::Error::Success();
  for (size_t i = 0; i < maps.size() && result.success(); ++i)
    result = Encode(d, a.maps[i], a.map_addresses[i], &maps[i]);
  std::vector<void*> params;
  for (void*& p : a.pointers) params.push_back(&p);
  for (CUtensorMap& m : maps) params.push_back(&m);
  if (result.success()) result = Dispatch(d, stream, call, f, params.data());
  CUcontext popped = nullptr;
  d.ctx_pop(&popped);
  return result;
}

// ---- the handlers ---------------------------------------------------------------------------------

ffi::Error Ready(const Driver& d, const Call& call) {
  if (!d.error.empty()) return ffi::Error(ffi::ErrorCode::kUnavailable, "mugraph: " + d.error);
  return CheckCall(call);
}

// Initialize stage (outside any command-buffer capture): load and check the module in the stream's context.
ffi::Error Prepare(CUstream stream, ffi::RemainingArgs, ffi::RemainingRets, std::string_view module,
                   std::string_view kernel, ffi::Span<const int64_t> grid,
                   ffi::Span<const int64_t> block, int64_t smem, ffi::Span<const int64_t> param_kind,
                   ffi::Span<const int64_t> param_index, ffi::Span<const int64_t> tensor_maps,
                   ffi::Span<const int64_t> cluster) {
  const Driver& d = GetDriver();
  Call call{module, kernel, grid, block, smem, param_kind, param_index, tensor_maps, cluster};
  if (ffi::Error e = Ready(d, call); e.failure()) return e;
  CUcontext ctx = nullptr;
  Function f;
  if (ffi::Error e = StreamContext(d, stream, &ctx); e.failure()) return e;
  return GetFunction(d, ctx, module, kernel, smem, call.ClusterSize(), &f);
}

ffi::Error PrepareWorkspace(CUstream stream, ffi::RemainingArgs args, ffi::RemainingRets rets,
                            std::string_view module, std::string_view kernel,
                            ffi::Span<const int64_t> grid, ffi::Span<const int64_t> block,
                            int64_t smem, ffi::Span<const int64_t> param_kind,
                            ffi::Span<const int64_t> param_index,
                            ffi::Span<const int64_t> tensor_maps, ffi::Span<const int64_t> cluster,
                            ffi::Span<const int64_t>, ffi::Span<const int64_t>) {
  return Prepare(stream, args, rets, module, kernel, grid, block, smem, param_kind, param_index,
                 tensor_maps, cluster);
}

// Plans without workspace: operands and results only (command-buffer compatible).
ffi::Error Execute(CUstream stream, ffi::RemainingArgs args, ffi::RemainingRets rets,
                   std::string_view module, std::string_view kernel, ffi::Span<const int64_t> grid,
                   ffi::Span<const int64_t> block, int64_t smem, ffi::Span<const int64_t> param_kind,
                   ffi::Span<const int64_t> param_index, ffi::Span<const int64_t> tensor_maps,
                   ffi::Span<const int64_t> cluster) {
  const Driver& d = GetDriver();
  Call call{module, kernel, grid, block, smem, param_kind, param_index, tensor_maps, cluster};
  if (ffi::Error e = Ready(d, call); e.failure()) return e;
  return Launch(d, stream, call, args, rets, {});
}

// cuMemsetD8Async on XLA's stream of each workspace buffer the plan asks to start zeroed, in the
// stream's context.
ffi::Error ZeroWorkspace(const Driver& d, CUstream stream, const std::vector<void*>& workspace,
                         ffi::Span<const int64_t> bytes, ffi::Span<const int64_t> zero) {
  CUcontext ctx = nullptr, popped = nullptr;
  if (ffi::Error e = StreamContext(d, stream, &ctx); e.failure()) return e;
  if (CUresult rc = d.ctx_push(ctx)) return DriverError(d, rc, "cuCtxPushCurrent");
  CUresult rc = 0;
  for (size_t i = 0; i < workspace.size() && rc == 0; ++i)
    if (zero[i])
      rc = d.memset_d8_async(reinterpret_cast<CUdeviceptr>(workspace[i]), 0, static_cast<size_t>(bytes[i]),
                             stream);
  d.ctx_pop(&popped);
  return rc ? DriverError(d, rc, "cuMemsetD8Async(workspace)") : ffi::Error::Success();
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
                            ffi::Span<const int64_t> tensor_maps, ffi::Span<const int64_t> cluster,
                            ffi::Span<const int64_t> workspace_bytes,
                            ffi::Span<const int64_t> workspace_zero) {
  const Driver& d = GetDriver();
  Call call{module, kernel, grid, block, smem, param_kind, param_index, tensor_maps, cluster};
  if (ffi::Error e = Ready(d, call); e.failure()) return e;
  if (workspace_bytes.size() != workspace_zero.size())
    return Invalid("workspace_bytes and workspace_zero differ in length");
  std::vector<void*> workspace(workspace_bytes.size());
  for (size_t i = 0; i < workspace.size(); ++i) {
    size_t bytes = static_cast<size_t>(workspace_bytes[i]);
    std::optional<void*> ptr = scratch.Allocate(bytes, kWorkspaceAlign);
    if (!ptr.has_value())
      return ffi::Error(ffi::ErrorCode::kResourceExhausted,
                        "mugraph: XLA's scratch allocator has no " + std::to_string(bytes) +
                            " bytes for " + std::string(kernel) + "'s workspace");
    workspace[i] = *ptr;
  }
  if (ffi::Error e = ZeroWorkspace(d, stream, workspace, workspace_bytes, workspace_zero); e.failure())
    return e;
  return Launch(d, stream, call, args, rets, workspace);
}

// The flat form of one map's encoding arguments, in cuTensorMapEncodeTiled's order (codegen/tma.py's
// DriverArgs.flat): dtype, rank, address, dims, outer strides, box, element strides, four enums.
std::vector<uint64_t> FlatArgs(const TensorMapArgs& a, uint64_t address) {
  std::vector<uint64_t> out{static_cast<uint64_t>(a.dtype), a.rank, address};
  out.insert(out.end(), a.dims, a.dims + a.rank);
  out.insert(out.end(), a.strides, a.strides + a.rank - 1);
  out.insert(out.end(), a.box, a.box + a.rank);
  out.insert(out.end(), a.element_strides, a.element_strides + a.rank);
  for (int e : {a.interleave, a.swizzle, a.l2_promotion, a.oob_fill}) out.push_back(static_cast<uint64_t>(e));
  return out;
}

// On the CPU, with the launch handlers' attributes and operands: the launch they would make, written
// as uint64 words into the last result (a byte buffer; earlier results stand for the kernel's):
// [uses cuLaunchKernelEx, grid x3, block x3, smem, cluster x3, pointer count, pointers...,
//  map count, per map its FlatArgs...]. Workspace pointers are reported as 0 (no allocator here).
ffi::Error Describe(ffi::RemainingArgs args, ffi::RemainingRets rets, const Call& call, size_t workspace) {
  if (ffi::Error e = CheckCall(call); e.failure()) return e;
  if (rets.size() < 1) return Invalid("describe needs a result buffer to write into");
  auto out = rets.get<ffi::AnyBuffer>(rets.size() - 1);
  if (out.has_error()) return out.error();
  Arguments a;
  if (ffi::Error e = Gather(call, args, rets, std::vector<void*>(workspace, nullptr), &a); e.failure()) return e;
  std::vector<uint64_t> words{call.ClusterSize() > 1 ? 1u : 0u};
  for (auto span : {call.grid, call.block}) words.insert(words.end(), span.begin(), span.end());
  words.push_back(static_cast<uint64_t>(call.smem));
  words.insert(words.end(), call.cluster.begin(), call.cluster.end());
  words.push_back(a.pointers.size());
  for (void* p : a.pointers) words.push_back(reinterpret_cast<uint64_t>(p));
  words.push_back(a.maps.size());
  for (size_t i = 0; i < a.maps.size(); ++i) {
    std::vector<uint64_t> flat = FlatArgs(a.maps[i], reinterpret_cast<uint64_t>(a.map_addresses[i]));
    words.insert(words.end(), flat.begin(), flat.end());
  }
  size_t bytes = (*out)->size_bytes();
  if (words.size() * 8 > bytes) return Invalid("describe's result buffer is too small");
  std::memset((*out)->untyped_data(), 0, bytes);
  std::memcpy((*out)->untyped_data(), words.data(), words.size() * 8);
  return ffi::Error::Success();
}

ffi::Error DescribeLaunch(ffi::RemainingArgs args, ffi::RemainingRets rets, std::string_view module,
                          std::string_view kernel, ffi::Span<const int64_t> grid,
                          ffi::Span<const int64_t> block, int64_t smem,
                          ffi::Span<const int64_t> param_kind, ffi::Span<const int64_t> param_index,
                          ffi::Span<const int64_t> tensor_maps, ffi::Span<const int64_t> cluster) {
  Call call{module, kernel, grid, block, smem, param_kind, param_index, tensor_maps, cluster};
  return Describe(args, rets, call, 0);
}

ffi::Error DescribeLaunchWorkspace(ffi::RemainingArgs args, ffi::RemainingRets rets,
                                   std::string_view module, std::string_view kernel,
                                   ffi::Span<const int64_t> grid, ffi::Span<const int64_t> block,
                                   int64_t smem, ffi::Span<const int64_t> param_kind,
                                   ffi::Span<const int64_t> param_index,
                                   ffi::Span<const int64_t> tensor_maps,
                                   ffi::Span<const int64_t> cluster,
                                   ffi::Span<const int64_t> workspace_bytes,
                                   ffi::Span<const int64_t> workspace_zero) {
  if (workspace_bytes.size() != workspace_zero.size())
    return Invalid("workspace_bytes and workspace_zero differ in length");
  Call call{module, kernel, grid, block, smem, param_kind, param_index, tensor_maps, cluster};
  return Describe(args, rets, call, workspace_bytes.size());
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
      .template Attr<ffi::Span<const int64_t>>("param_index")
      .template Attr<ffi::Span<const int64_t>>("tensor_maps")
      .template Attr<ffi::Span<const int64_t>>("cluster");
}

template <typename B>
auto WithWorkspace(B binding) {
  return std::move(binding)
      .template Attr<ffi::Span<const int64_t>>("workspace_bytes")
      .template Attr<ffi::Span<const int64_t>>("workspace_zero");
}

void CopyMessage(const std::string& message, char* why, int64_t why_size) {
  if (why == nullptr || why_size <= 0) return;
  size_t n = std::min(message.size(), static_cast<size_t>(why_size - 1));
  std::memcpy(why, message.data(), n);
  why[n] = '\0';
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
  CopyMessage(message, why, why_size);
  return 0;
}

extern "C" int64_t mg_module_count() {
  std::lock_guard<std::mutex> lock(registry_mutex);
  return static_cast<int64_t>(images.size());
}

// ---- tensor maps and the device, from Python (tests and the launcher's planning) -----------------

// The arguments the handlers pass cuTensorMapEncodeTiled for one kMapFields record at `address`, as
// FlatArgs into `out` (at most `out_size` words). Returns the word count, or -1 with the decoder's
// message in `why`. Needs no GPU.
extern "C" int64_t mg_tensor_map_args(const int64_t* record, int64_t size, uint64_t address,
                                      uint64_t* out, int64_t out_size, char* why, int64_t why_size) {
  TensorMapArgs a;
  ffi::Span<const int64_t> span(record, static_cast<size_t>(size));
  ffi::Error e = size == kMapFields ? DecodeTensorMap(span, 0, &a)
                                    : Invalid("a record holds " + std::to_string(kMapFields) + " values");
  if (e.failure()) {
    CopyMessage(e.message(), why, why_size);
    return -1;
  }
  std::vector<uint64_t> flat = FlatArgs(a, address);
  if (static_cast<int64_t>(flat.size()) > out_size) return -1;
  std::copy(flat.begin(), flat.end(), out);
  return static_cast<int64_t>(flat.size());
}

// The driver's 128-byte CUtensorMap for one record at device `address`, encoded as the handlers do.
// Returns 0, or -1 with the reason in `why` (no driver, a bad record, the driver's refusal).
extern "C" int64_t mg_encode_tensor_map(const int64_t* record, int64_t size, uint64_t address,
                                        uint8_t* out, char* why, int64_t why_size) {
  const Driver& d = GetDriver();
  TensorMapArgs a;
  ffi::Span<const int64_t> span(record, static_cast<size_t>(size));
  ffi::Error e = !d.error.empty() ? ffi::Error(ffi::ErrorCode::kUnavailable, "mugraph: " + d.error)
                 : size == kMapFields ? DecodeTensorMap(span, 0, &a)
                                      : Invalid("a record holds " + std::to_string(kMapFields) + " values");
  CUtensorMap map;
  if (e.success()) e = Encode(d, a, reinterpret_cast<void*>(address), &map);
  if (e.failure()) {
    CopyMessage(e.message(), why, why_size);
    return -1;
  }
  std::memcpy(out, &map, sizeof(map));
  return 0;
}

// The per-block shared-memory opt-in limit of CUDA device `ordinal` (bytes), or -1 without a driver
// or device.
extern "C" int64_t mg_device_smem_optin(int64_t ordinal) {
  const Driver& d = GetDriver();
  CUdevice device = 0;
  int value = 0;
  if (!d.error.empty() || d.init(0) || d.device_get(&device, static_cast<int>(ordinal)) ||
      d.device_get_attribute(&value, kDeviceSmemOptin, device))
    return -1;
  return value;
}

// This file's copy of cuda.h's layouts and constants, in a fixed order (tests compare them with cuda.h's
// own where a CUDA toolkit is installed): returns how many values it wrote.
extern "C" int64_t mg_driver_abi(int64_t* out, int64_t size) {
  const int64_t values[] = {sizeof(CUlaunchAttribute), offsetof(CUlaunchAttribute, value),
                            sizeof(CUlaunchConfig), offsetof(CUlaunchConfig, stream),
                            offsetof(CUlaunchConfig, attrs), offsetof(CUlaunchConfig, num_attrs),
                            sizeof(CUtensorMap), alignof(CUtensorMap), kClusterDimension,
                            kFuncSharedSizeBytes, kMaxDynamicSharedSizeBytes, kRequiredClusterWidth,
                            kNonPortableClusterSize, kDeviceSmemOptin, kComputeMajor, kComputeMinor,
                            kNoBinaryForGpu};
  int64_t n = static_cast<int64_t>(sizeof(values) / sizeof(values[0]));
  std::copy(values, values + std::min(n, size), out);
  return n;
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
XLA_FFI_DEFINE_HANDLER_SYMBOL(MugraphDescribe, DescribeLaunch, WithCall(ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(MugraphDescribeWorkspace, DescribeLaunchWorkspace,
                              WithWorkspace(WithCall(ffi::Ffi::Bind())));
XLA_FFI_DEFINE_HANDLER_SYMBOL(MugraphRecordEvent, RecordEvent,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<CUstream>>()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attr<int64_t>("event"));
