#include "kernels/backend.h"

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
[[noreturn]] void no_cuda() {
  throw BackendError(
      "backend = \"cuda\": this build has no CUDA backend (configure with `cmake --preset "
      "cuda` on a machine with the CUDA toolkit), or use backend = \"cpu\"");
}
}  // namespace

template <>
const Catalogue<double>& backend_catalogue(const std::string& backend,
                                           const std::string& precision) {
  if (backend != "cpu")
    throw BackendError("train.precision = \"" + precision + "\" runs on backend = \"cpu\" only");
  return cpu_catalogue<double>();
}

template <>
const Catalogue<float>& backend_catalogue(const std::string& backend,
                                          const std::string& precision) {
  if (precision == "bf16")  // a caller's mistake, not the user's: bf16 has its own catalogue type
    throw std::logic_error("backend_catalogue<float>: bf16 mode is Catalogue<float, bf16>");
  if (backend == "cpu") return cpu_catalogue<float>();
  if (backend != "cuda") throw BackendError("backend = \"" + backend + "\": expected cpu or cuda");
#ifdef DIVLAB_HAVE_CUDA
  return cuda::catalogue();
#else
  no_cuda();
#endif
}

template <>
const Catalogue<float, bf16>& backend_catalogue(const std::string& backend,
                                                const std::string& precision) {
  (void)precision;
  if (backend == "cpu") return cpu_bf16_catalogue();
  if (backend != "cuda") throw BackendError("backend = \"" + backend + "\": expected cpu or cuda");
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

std::pair<Catalogue<float, bf16>*, Bf16Set> device_bf16_catalogue(const std::string& device) {
  if (device == "cpu") return {&mutable_cpu_bf16_catalogue(), Bf16Set::Cpu};
  if (device != "cuda") throw BackendError("device '" + device + "': expected cpu or cuda");
#ifdef DIVLAB_HAVE_CUDA
  return {&cuda::mutable_bf16_catalogue(), Bf16Set::Cuda};
#else
  throw BackendError("a cuda plug-in needs the cuda build of divlab (cmake --preset cuda)");
#endif
}

std::string open_backend(const std::string& backend) {
  if (backend == "cpu") return "cpu";
#ifdef DIVLAB_HAVE_CUDA
  std::string error;
  const cuda::DeviceInfo d = cuda::query_device(&error);
  if (d.count == 0)
    throw BackendError("backend = \"cuda\": no usable GPU on this machine (" + error +
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

void set_kernel_debug_sync(bool on) {
#ifdef DIVLAB_HAVE_CUDA
  cuda::set_debug_sync(on);
#endif
  (void)on;
}

void check_backend_fits(const std::string& backend, size_t bytes, const std::string& what) {
  if (backend != "cuda") return;
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
