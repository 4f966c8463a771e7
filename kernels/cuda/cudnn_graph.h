// A thin layer over cuDNN's graph (backend) API, cudnn_graph.h: neither machine has the C++
// frontend headers, so graphs are built from backend descriptors directly.
//
// A Graph collects tensors (each with a unique id, a data type, dims and strides) and operations
// (matmul, pointwise, reduction, reshape) between them; plan() finalises the operation graph,
// asks cuDNN's heuristics for engine configurations and keeps the first that finalises into an
// execution plan, preferring configurations without cuDNN's "nondeterministic" numerical note.
// Every backend call is checked (DIVLAB_CUDNN_CHECK) and names the call on failure.
#pragma once

#include <cudnn_graph.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/op_context.h"

namespace divlab::cuda {

void check_cudnn(cudnnStatus_t s, const char* call, const char* file, int line);
#define DIVLAB_CUDNN_CHECK(call) ::divlab::cuda::check_cudnn((call), #call, __FILE__, __LINE__)

// The process's cuDNN handle, on the default stream (the stream every other kernel uses).
cudnnHandle_t cudnn();
// cudnnGetVersion() of the loaded library (e.g. 91400), for messages and docs.
long cudnn_version();

// One backend descriptor, destroyed with its owner.
class Descriptor {
 public:
  explicit Descriptor(cudnnBackendDescriptorType_t type);
  ~Descriptor();
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  cudnnBackendDescriptor_t get() const { return d_; }
  Descriptor& set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count,
                  const void* values);
  Descriptor& set_desc(cudnnBackendAttributeName_t name, const Descriptor& value);
  void finalize();

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

using Uid = int64_t;

// What a finished plan needs at execution time.
struct Plan {
  std::shared_ptr<Descriptor> plan;
  int64_t workspace_bytes = 0;
  bool deterministic = false;  // the engine carries no CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC
  std::string engine;          // "engine <global index>", for messages and docs
};

class Graph {
 public:
  // A tensor of dims/strides (row-major meaning: strides in elements). Virtual tensors live only
  // inside the fused kernel; by-value tensors are host scalars passed at execution.
  Uid tensor(cudnnDataType_t type, std::vector<int64_t> dims, std::vector<int64_t> strides,
             bool is_virtual = false, bool by_value = false);
  Uid scalar(cudnnDataType_t type) { return tensor(type, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true); }
  // The dims and strides given for a tensor (to derive a virtual output's shape).
  const std::vector<int64_t>& dims(Uid t) const;

  void matmul(Uid a, Uid b, Uid c);
  // y = mode(x [, b [, t]]); `compute` is the math precision; `axis` only for GEN_INDEX.
  void pointwise(cudnnPointwiseMode_t mode, Uid x, Uid y, Uid b = -1, Uid t = -1,
                 cudnnDataType_t compute = CUDNN_DATA_FLOAT, int64_t axis = -1);
  void reduction(cudnnReduceTensorOp_t op, Uid x, Uid y);
  void reshape(Uid x, Uid y);

  // Finalises the graph and returns an execution plan. Throws CudaError naming `what` when no
  // engine supports the graph (with the last backend status).
  Plan plan(const std::string& what) const;
  // Every configuration the heuristics of `modes` offer that finalises, in plan()'s order
  // (deterministic ones first within each mode), to `take` until it returns true. Throws like
  // plan() when none finalises.
  void visit_plans(const std::string& what, const std::vector<cudnnBackendHeurMode_t>& modes,
                   const std::function<bool(const Plan&)>& take) const;

 private:
  struct Tensor {
    Uid uid;
    std::vector<int64_t> dims;
    std::shared_ptr<Descriptor> desc;
  };
  const Descriptor& desc(Uid t) const;
  std::vector<Tensor> tensors_;
  std::vector<std::shared_ptr<Descriptor>> ops_;    // operation descriptors, in order
  std::vector<std::shared_ptr<Descriptor>> owned_;  // their pointwise/matmul/... descriptors
};

// Runs `plan` with the given (uid, device or host-scalar pointer) bindings and a workspace of at
// least plan.workspace_bytes.
// Runs `plan` on the call's stream (ctx.stream: a cudaStream_t; null: the legacy default stream).
void execute(const Plan& plan, const std::vector<std::pair<Uid, void*>>& bindings, void* workspace,
             const OpContext& ctx);

}  // namespace divlab::cuda
