#include "kernels/backend.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <utility>

#include "kernels/bf16_activations.h"

#ifdef DIVLAB_HAVE_CUDA
#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"
#endif

namespace divlab {

bool cuda_built() {
#ifdef DIVLAB_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

namespace {
constexpr const char* kNoCudaBuild =
    "this build has no CUDA backend (configure with `cmake --preset cuda` on a machine with the "
    "CUDA toolkit)";
constexpr const char* kNoGpu = "no usable GPU on this machine";

[[noreturn]] void no_cuda() {
  throw BackendError(std::string("backend = \"cuda\": ") + kNoCudaBuild +
                     ", or use backend = \"cpu\"");
}
}  // namespace

std::string cuda_unavailable() {
  if (!cuda_built()) return kNoCudaBuild;
  if (cuda_device_count() == 0) return kNoGpu;
  return "";
}

template <>
const Catalogue<double>& backend_catalogue(Backend backend, Precision precision) {
  if (backend != Backend::Cpu)
    throw BackendError(std::string("train.precision = \"") + name_of(precision) +
                       "\" runs on backend = \"cpu\" only");
  return cpu_catalogue<double>();
}

template <>
const Catalogue<float>& backend_catalogue(Backend backend, Precision precision) {
  if (precision == Precision::Bf16)  // a caller's mistake: bf16 has its own catalogue type
    throw std::logic_error("backend_catalogue<float>: bf16 mode is Catalogue<float, bf16>");
  if (backend == Backend::Cpu) return cpu_catalogue<float>();
#ifdef DIVLAB_HAVE_CUDA
  return cuda::catalogue();
#else
  no_cuda();
#endif
}

const DeviceComparison* device_shadow_comparison(Backend backend) {
  if (backend == Backend::Cpu) return nullptr;
#ifdef DIVLAB_HAVE_CUDA
  return &cuda::shadow_comparison();
#else
  no_cuda();
#endif
}

template <>
const Catalogue<float, bf16>& backend_catalogue(Backend backend, Precision /*bf16*/) {
  if (backend == Backend::Cpu) return cpu_bf16_catalogue();
#ifdef DIVLAB_HAVE_CUDA
  return cuda::bf16_catalogue();
#else
  no_cuda();
#endif
}

std::vector<Catalogue<float>*> device_catalogues(const std::string& device) {
  if (device == "cpu") return {&mutable_cpu_catalogue()};
  if (device != "cuda") throw BackendError("device '" + device + "': expected cpu or cuda");
#ifdef DIVLAB_HAVE_CUDA
  return {&cuda::mutable_catalogue()};  // fp32 mode; bf16 mode adopts: device_bf16_catalogue
#else
  throw BackendError("a cuda plug-in needs the cuda build of divlab (cmake --preset cuda)");
#endif
}

std::pair<Catalogue<float, bf16>*, const Bf16Conversions*> device_bf16_catalogue(
    const std::string& device) {
  if (device == "cpu") return {&mutable_cpu_bf16_catalogue(), &host_bf16_conversions()};
  if (device != "cuda") throw BackendError("device '" + device + "': expected cpu or cuda");
#ifdef DIVLAB_HAVE_CUDA
  return {&cuda::mutable_bf16_catalogue(), &cuda::bf16_conversions()};
#else
  throw BackendError("a cuda plug-in needs the cuda build of divlab (cmake --preset cuda)");
#endif
}

const Fp16Conversions& device_fp16_conversions(const std::string& device) {
  if (device == "cpu") return host_fp16_conversions();
  if (device != "cuda") throw BackendError("device '" + device + "': expected cpu or cuda");
#ifdef DIVLAB_HAVE_CUDA
  return cuda::fp16_conversions();
#else
  throw BackendError("a cuda plug-in needs the cuda build of divlab (cmake --preset cuda)");
#endif
}

std::string open_backend(Backend backend) {
  if (backend == Backend::Cpu) return "cpu";
#ifdef DIVLAB_HAVE_CUDA
  std::string error;
  const cuda::DeviceInfo d = cuda::query_device(&error);
  if (d.count == 0)
    throw BackendError(std::string("backend = \"cuda\": ") + kNoGpu + " (" + error +
                       "); use backend = \"cpu\"");
  if (d.major < cuda::kMinMajor)
    throw BackendError("backend = \"cuda\": GPU '" + d.name + "' has compute capability " +
                       std::to_string(d.major) + "." + std::to_string(d.minor) +
                       "; this build runs on " + std::to_string(cuda::kMinMajor) +
                       ".0 or newer (H100/H200: sm_90)");
  return d.name + " (sm_" + std::to_string(d.major) + std::to_string(d.minor) + ")";
#else
  no_cuda();
#endif
}

int cuda_device_count() {
#ifdef DIVLAB_HAVE_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
#else
  return 0;
#endif
}

namespace {
// A number read from a one-line file (cgroup's files), or `fallback` for "max" or no file.
size_t read_bytes(const char* path, size_t fallback) {
  std::ifstream in(path);
  std::string word;
  if (!(in >> word) || word == "max") return fallback;
  try {
    return size_t(std::stoull(word));
  } catch (const std::exception&) {
    return fallback;
  }
}
}  // namespace

size_t available_host_memory() {
  constexpr size_t kNone = std::numeric_limits<size_t>::max();
  size_t available = kNone;
  std::ifstream meminfo("/proc/meminfo");
  for (std::string line; std::getline(meminfo, line);)
    if (line.rfind("MemAvailable:", 0) == 0) {
      std::istringstream fields(line.substr(13));
      size_t kib = 0;
      if (fields >> kib) available = kib << 10;
    }
  const std::pair<const char*, const char*> cgroups[] = {
      {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"},
      {"/sys/fs/cgroup/memory/memory.limit_in_bytes",
       "/sys/fs/cgroup/memory/memory.usage_in_bytes"}};
  for (const auto& [limit_path, usage_path] : cgroups) {
    const size_t limit = read_bytes(limit_path, kNone), usage = read_bytes(usage_path, 0);
    if (limit != kNone && limit > (size_t(1) << 60)) continue;  // v1's "no limit"
    if (limit != kNone) available = std::min(available, limit > usage ? limit - usage : 0);
  }
  return available == kNone ? 0 : available;
}

void check_backend_fits(Backend backend, size_t bytes, const std::string& what) {
  if (backend == Backend::Cpu) {
    const size_t available = available_host_memory();
    if (available > 0 && bytes + kHostProcessMargin > available) {
      char buf[256];
      std::snprintf(buf, sizeof buf, "%s needs %.2f GiB of memory; %.2f GiB available",
                    what.c_str(), double(bytes) / (1 << 30), double(available) / (1 << 30));
      throw BackendError(std::string("out of memory: ") + buf);
    }
    return;
  }
#ifdef DIVLAB_HAVE_CUDA
  try {
    cuda::check_fits(bytes, what);
  } catch (const cuda::DeviceBusy& e) {
    throw BackendBusy(std::string("device busy: ") + e.what() +
                      " (other processes hold the rest; retry when they end)");
  } catch (const cuda::OutOfDeviceMemory& e) {
    throw BackendError(std::string("out of device memory: ") + e.what());
  }
#endif
}

}  // namespace divlab
