// This process's device memory, for check's leak probe (kernels/memory.h, bytes_in_use). The
// runtime only tells the whole device's use (cudaMemGetInfo), which counts every process on the
// GPU; the driver's management library (NVML) lists each process's own. It is loaded at run time
// (libnvidia-ml.so.1 comes with the driver, not the toolkit, so linking it would stop the cuda
// build from starting where there is no driver), and used where it lists this process: in a
// container with its own PID namespace, under MIG or on a driver without it, it does not, and the
// device's whole use is read instead (check's probe then tells other processes' allocations from
// the kernel's by waiting, kernels/op_cases.h).
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <unistd.h>

#include <cstdint>
#include <vector>

#include "kernels/cuda/runtime.h"

namespace divlab::cuda {

namespace {

// The part of NVML's C interface used here (nvml.h, which the toolkit here does not ship: the
// driver's interface, stable since its _v3 entry points).
using NvmlDevice = void*;
struct NvmlProcessInfo {
  unsigned int pid;
  unsigned long long used_bytes;  // ~0ull: not available (MIG, some drivers)
  unsigned int gpu_instance, compute_instance;
};
constexpr int kNvmlSuccess = 0, kNvmlInsufficientSize = 7;

struct Nvml {
  int (*init)() = nullptr;
  int (*device_by_pci_bus)(const char*, NvmlDevice*) = nullptr;
  int (*processes)(NvmlDevice, unsigned int*, NvmlProcessInfo*) = nullptr;
  bool ready = false;
};

const Nvml& nvml() {
  static const Nvml loaded = [] {
    Nvml n;
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) return n;
    n.init = reinterpret_cast<int (*)()>(dlsym(lib, "nvmlInit_v2"));
    n.device_by_pci_bus = reinterpret_cast<int (*)(const char*, NvmlDevice*)>(
        dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2"));
    n.processes = reinterpret_cast<int (*)(NvmlDevice, unsigned int*, NvmlProcessInfo*)>(
        dlsym(lib, "nvmlDeviceGetComputeRunningProcesses_v3"));
    n.ready = n.init && n.device_by_pci_bus && n.processes && n.init() == kNvmlSuccess;
    return n;
  }();
  return loaded;
}

}  // namespace

int64_t own_device_bytes() {
  const Nvml& n = nvml();
  if (!n.ready) return -1;
  int device = 0;
  char bus[32] = {};
  NvmlDevice handle = nullptr;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetPCIBusId(bus, int(sizeof bus), device) != cudaSuccess ||
      n.device_by_pci_bus(bus, &handle) != kNvmlSuccess)
    return -1;
  std::vector<NvmlProcessInfo> list(64);
  for (;;) {
    auto count = static_cast<unsigned int>(list.size());
    const int rc = n.processes(handle, &count, list.data());
    if (rc == kNvmlInsufficientSize) {
      list.resize(size_t(count) + 64);
      continue;
    }
    if (rc != kNvmlSuccess) return -1;
    for (unsigned int i = 0; i < count; ++i)
      if (list[i].pid == unsigned(getpid()))
        return list[i].used_bytes == ~0ull ? -1 : int64_t(list[i].used_bytes);
    return -1;
  }
}

size_t device_bytes_in_use() {
  const int64_t own = own_device_bytes();
  if (own >= 0) return size_t(own);
  size_t free = 0, total = 0;
  DIVLAB_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return total - free;
}

}  // namespace divlab::cuda
