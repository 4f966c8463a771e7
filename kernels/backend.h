// Backends: which kernel catalogue runs a configuration, and whether it can run here.
//   cpu:  Eigen + OpenMP; precision fp32, fp64, or bf16 (the fp32 kernels with activations
//         stored in bf16 between ops: kernels/bf16_activations.h).
//   cuda: CUDA + cuBLAS + cuDNN (this build with the `cuda` preset); precision fp32 (fp32
//         GEMMs, for parity with the CPU) or bf16 (activations stored in bf16, GEMMs on bf16
//         tensor cores with fp32 accumulation; fp32 master weights, optimizer state and
//         residual stream).
#pragma once

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/named_enum.h"
#include "kernels/bf16_activations.h"
#include "kernels/common/lowp.h"
#include "kernels/fp16_activations.h"
#include "kernels/registry.h"

namespace divlab {

enum class Backend { Cpu, Cuda };
template <>
struct EnumNames<Backend> {
  static constexpr std::pair<Backend, const char*> table[] = {{Backend::Cpu, "cpu"},
                                                              {Backend::Cuda, "cuda"}};
};
// The run's working precision: fp32, fp64 (cpu), or bf16 (activations stored in bf16).
enum class Precision { Fp32, Fp64, Bf16 };
template <>
struct EnumNames<Precision> {
  static constexpr std::pair<Precision, const char*> table[] = {
      {Precision::Fp32, "fp32"}, {Precision::Fp64, "fp64"}, {Precision::Bf16, "bf16"}};
};

// A backend/precision combination that cannot run: what() is one line for the user (exit 2).
struct BackendError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// The device could hold the run but other processes hold the memory now: retry later (exit 75).
struct BackendBusy : BackendError {
  using BackendError::BackendError;
};

bool cuda_built();
// Why this process cannot run the cuda backend (no CUDA in the build, or no GPU), or "" if it
// can; only counts devices, so no context is started (one would stay held all run long).
std::string cuda_unavailable();

// Every fp32 catalogue whose kernels take pointers of `device` ("cpu" | "cuda"), for plug-ins
// to add variants to. Throws BackendError for cuda in a build without it.
std::vector<Catalogue<float>*> device_catalogues(const std::string& device);
// The bf16-mode catalogue of `device`, which adopts plug-in variants through adapters
// (kernels/bf16_activations.h), and the conversions its adapters use.
std::pair<Catalogue<float, bf16>*, const Bf16Conversions*> device_bf16_catalogue(
    const std::string& device);

// The conversions `device`'s fp32 mode runs fp16 plug-in kernels with
// (kernels/fp16_activations.h).
const Fp16Conversions& device_fp16_conversions(const std::string& device);

// The catalogue for `backend` and `precision`, storing T (and activations in A). Touches no
// device, so configurations can be checked anywhere. Throws BackendError for a combination this
// build does not have. bf16 mode is Catalogue<float, bf16> (activations in bf16); fp32 and
// fp64 are Catalogue<float> and Catalogue<double>.
template <class T, class A = T>
const Catalogue<T, A>& backend_catalogue(Backend backend, Precision precision);

// Calls f(catalogue) with the catalogue a run of `backend` and `precision` selects its kernels
// from (fp64: the fp32 catalogue, which names the same variants), whatever its storage types.
template <class F>
decltype(auto) with_backend_catalogue(Backend backend, Precision precision, F&& f) {
  if (precision == Precision::Bf16) return f(backend_catalogue<float, bf16>(backend, precision));
  return f(backend_catalogue<float>(backend, Precision::Fp32));
}

struct DeviceComparison;
// How a run of `backend` compares shadow candidates on its own device (shadow.reference =
// "fp32_device", kernels/shadow.h); null for the cpu, whose shadow reference is fp64 on the host.
// Throws BackendError for cuda in a build without it.
const DeviceComparison* device_shadow_comparison(Backend backend);

// Makes sure `backend` can run on this machine now (for cuda: a GPU of compute capability 9.0 or
// newer) and returns a one-line description of the device. Throws BackendError.
std::string open_backend(Backend backend);

// The GPUs this process may use (CUDA_VISIBLE_DEVICES applied), without starting a context on
// any of them; 0 in a build without CUDA or where none is usable.
int cuda_device_count();

// Throws BackendError when `bytes` of tensors will not fit in the backend's free memory: the
// device's (cuda), or the host's available memory within this process's cgroup limit (cpu).
// `what` names the consumer.
void check_backend_fits(Backend backend, size_t bytes, const std::string& what);

// Bytes of host memory this process can still take: MemAvailable, lowered to what is left
// under a cgroup (v2 or v1) memory limit. 0 if neither can be read.
size_t available_host_memory();
// A cpu run's host memory beyond its predicted buffers (the dataset, thread stacks, HDF5's
// caches): check_backend_fits asks for it on top, and a sweep counts it for each cell.
constexpr size_t kHostProcessMargin = size_t(256) << 20;

}  // namespace divlab
