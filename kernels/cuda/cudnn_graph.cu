#include <cstdio>
#include <functional>
#include <mutex>
#include <stdexcept>

#include "kernels/cuda/cudnn_graph.h"
#include "kernels/cuda/runtime.h"

namespace divlab::cuda {

void check_cudnn(cudnnStatus_t s, const char* call, const char* file, int line) {
  if (s == CUDNN_STATUS_SUCCESS) return;
  char detail[512] = {0};
  cudnnGetLastErrorString(detail, sizeof detail);
  fail(std::string("cuDNN error ") + cudnnGetErrorString(s) + " in " + call +
           (detail[0] ? std::string(": ") + detail : std::string()),
       file, line);
}

cudnnHandle_t cudnn() {
  static cudnnHandle_t handle = [] {
    cudnnHandle_t h = nullptr;
    DIVLAB_CUDNN_CHECK(cudnnCreate(&h));
    DIVLAB_CUDNN_CHECK(cudnnSetStream(h, nullptr));
    return h;
  }();
  return handle;
}

long cudnn_version() {
  return long(cudnnGetVersion());
}

Descriptor::Descriptor(cudnnBackendDescriptorType_t type) {
  DIVLAB_CUDNN_CHECK(cudnnBackendCreateDescriptor(type, &d_));
}
Descriptor::~Descriptor() {
  if (d_) cudnnBackendDestroyDescriptor(d_);
}
Descriptor& Descriptor::set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
                            int64_t count, const void* values) {
  DIVLAB_CUDNN_CHECK(cudnnBackendSetAttribute(d_, name, type, count, values));
  return *this;
}
Descriptor& Descriptor::set_desc(cudnnBackendAttributeName_t name, const Descriptor& value) {
  cudnnBackendDescriptor_t v = value.get();
  return set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v);
}
void Descriptor::finalize() {
  DIVLAB_CUDNN_CHECK(cudnnBackendFinalize(d_));
}

Uid Graph::tensor(cudnnDataType_t type, std::vector<int64_t> dims, std::vector<int64_t> strides,
                  bool is_virtual, bool by_value) {
  const Uid uid = Uid(tensors_.size()) + 1;
  auto d = std::make_shared<Descriptor>(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  const int64_t alignment = 16;
  d->set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type)
      .set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, int64_t(dims.size()), dims.data())
      .set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, int64_t(strides.size()), strides.data())
      .set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid)
      .set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment)
      .set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
  if (by_value) d->set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
  d->finalize();
  tensors_.push_back({uid, std::move(dims), std::move(d)});
  return uid;
}

const Descriptor& Graph::desc(Uid t) const {
  if (t < 1 || t > Uid(tensors_.size())) throw std::logic_error("cudnn graph: unknown tensor");
  return *tensors_[size_t(t - 1)].desc;
}
const std::vector<int64_t>& Graph::dims(Uid t) const {
  desc(t);
  return tensors_[size_t(t - 1)].dims;
}

void Graph::matmul(Uid a, Uid b, Uid c) {
  auto m = std::make_shared<Descriptor>(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
  const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  m->set(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute).finalize();
  auto op = std::make_shared<Descriptor>(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
  op->set_desc(CUDNN_ATTR_OPERATION_MATMUL_ADESC, desc(a))
      .set_desc(CUDNN_ATTR_OPERATION_MATMUL_BDESC, desc(b))
      .set_desc(CUDNN_ATTR_OPERATION_MATMUL_CDESC, desc(c))
      .set_desc(CUDNN_ATTR_OPERATION_MATMUL_DESC, *m)
      .finalize();
  owned_.push_back(m);
  ops_.push_back(op);
}

void Graph::pointwise(cudnnPointwiseMode_t mode, Uid x, Uid y, Uid b, Uid t,
                      cudnnDataType_t compute, int64_t axis) {
  auto p = std::make_shared<Descriptor>(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
  p->set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode)
      .set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &compute);
  if (axis >= 0) p->set(CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
  p->finalize();
  auto op = std::make_shared<Descriptor>(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
  op->set_desc(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, *p)
      .set_desc(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, desc(x))
      .set_desc(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, desc(y));
  if (b >= 0) op->set_desc(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, desc(b));
  if (t >= 0) op->set_desc(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, desc(t));
  op->finalize();
  owned_.push_back(p);
  ops_.push_back(op);
}

void Graph::reduction(cudnnReduceTensorOp_t how, Uid x, Uid y) {
  auto r = std::make_shared<Descriptor>(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
  const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  r->set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &how)
      .set(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute)
      .finalize();
  auto op = std::make_shared<Descriptor>(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
  op->set_desc(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, desc(x))
      .set_desc(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, desc(y))
      .set_desc(CUDNN_ATTR_OPERATION_REDUCTION_DESC, *r)
      .finalize();
  owned_.push_back(r);
  ops_.push_back(op);
}

void Graph::reshape(Uid x, Uid y) {
  auto op = std::make_shared<Descriptor>(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
  op->set_desc(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, desc(x))
      .set_desc(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, desc(y))
      .finalize();
  ops_.push_back(op);
}

namespace {
// The engine behind a configuration: its global index and whether cuDNN calls it
// nondeterministic.
std::pair<int64_t, bool> engine_facts(cudnnBackendDescriptor_t cfg) {
  Descriptor engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  cudnnBackendDescriptor_t e = engine.get();
  int64_t n = 0;
  DIVLAB_CUDNN_CHECK(cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE,
                                              CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &e));
  int64_t index = -1;
  DIVLAB_CUDNN_CHECK(
      cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &index));
  cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
  int64_t count = 0;
  DIVLAB_CUDNN_CHECK(cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
                                              CUDNN_TYPE_NUMERICAL_NOTE,
                                              CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &count, notes));
  bool nondeterministic = false;
  for (int64_t i = 0; i < count; ++i)
    nondeterministic |= notes[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC;
  return {index, !nondeterministic};
}

}  // namespace

void Graph::visit_plans(const std::string& what, const std::vector<cudnnBackendHeurMode_t>& modes,
                        const std::function<bool(const Plan&)>& take) const {
  cudnnHandle_t handle = cudnn();
  std::vector<cudnnBackendDescriptor_t> ops;
  for (const auto& op : ops_) ops.push_back(op->get());
  Descriptor graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  graph
      .set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, int64_t(ops.size()),
           ops.data())
      .set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
  const cudnnStatus_t graph_status = cudnnBackendFinalize(graph.get());
  if (graph_status != CUDNN_STATUS_SUCCESS) {
    char detail[512] = {0};
    cudnnGetLastErrorString(detail, sizeof detail);
    throw CudaError("cuDNN rejected the " + what + " graph: " + cudnnGetErrorString(graph_status) +
                    (detail[0] ? std::string(": ") + detail : ""));
  }

  std::string last_error = "no engine configurations";
  bool any = false;
  for (cudnnBackendHeurMode_t mode : modes) {
    Descriptor heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    heur.set_desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph)
        .set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    if (cudnnBackendFinalize(heur.get()) != CUDNN_STATUS_SUCCESS) continue;
    int64_t count = 0;
    if (cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                                 nullptr) != CUDNN_STATUS_SUCCESS ||
        count == 0)
      continue;
    std::vector<std::unique_ptr<Descriptor>> configs;
    std::vector<cudnnBackendDescriptor_t> raw;
    for (int64_t i = 0; i < count; ++i) {
      configs.push_back(std::make_unique<Descriptor>(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
      raw.push_back(configs.back()->get());
    }
    DIVLAB_CUDNN_CHECK(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &count,
                                                raw.data()));
    // Deterministic engines first: the reference kernels must give the same bits every run.
    for (bool want_deterministic : {true, false})
      for (int64_t i = 0; i < count; ++i) {
        const auto [index, deterministic] = engine_facts(raw[size_t(i)]);
        if (deterministic != want_deterministic) continue;
        auto plan = std::make_shared<Descriptor>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
        plan->set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle)
            .set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                 &raw[size_t(i)]);
        const cudnnStatus_t s = cudnnBackendFinalize(plan->get());
        if (s != CUDNN_STATUS_SUCCESS) {
          last_error =
              std::string("engine ") + std::to_string(index) + ": " + cudnnGetErrorString(s);
          continue;
        }
        Plan out;
        out.plan = plan;
        int64_t n = 0;
        DIVLAB_CUDNN_CHECK(cudnnBackendGetAttribute(plan->get(),
                                                    CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                                    CUDNN_TYPE_INT64, 1, &n, &out.workspace_bytes));
        out.deterministic = deterministic;
        out.engine = "engine " + std::to_string(index);
        any = true;
        if (take(out)) return;
      }
  }
  if (any) return;
  throw CudaError("cuDNN " + std::to_string(cudnn_version()) + " has no engine for the " + what +
                  " graph (" + last_error + ")");
}

Plan Graph::plan(const std::string& what) const {
  Plan first;
  visit_plans(what, {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}, [&](const Plan& p) {
    first = p;
    return true;
  });
  return first;
}

void execute(const Plan& plan, const std::vector<std::pair<Uid, void*>>& bindings, void* workspace,
             const OpContext& ctx) {
  std::vector<int64_t> uids;
  std::vector<void*> pointers;
  for (const auto& [uid, p] : bindings) uids.push_back(uid), pointers.push_back(p);
  Descriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, int64_t(uids.size()), uids.data())
      .set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, int64_t(pointers.size()),
           pointers.data())
      .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
  pack.finalize();
  DIVLAB_CUDNN_CHECK(cudnnSetStream(cudnn(), stream_of(ctx)));
  DIVLAB_CUDNN_CHECK(cudnnBackendExecute(cudnn(), plan.plan->get(), pack.get()));
  if (debug_sync(ctx)) DIVLAB_CUDA_CHECK(cudaStreamSynchronize(stream_of(ctx)));
}

}  // namespace divlab::cuda
