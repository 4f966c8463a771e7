#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/attention/cudnn_sdpa.h"
#include "kernels/cuda/cudnn_graph.h"
#include "kernels/cuda/runtime.h"

namespace divlab::cuda {

namespace {

// Strides (elements) of the views the graphs use.
struct Layout {
  int64_t B, NH, T, hd, C;
  Layout(int B_, int T_, int C_, int NH_) : B(B_), NH(NH_), T(T_), hd(C_ / NH_), C(C_) {}
  std::vector<int64_t> heads() const { return {B, NH, T, hd}; }
  std::vector<int64_t> in_qkv() const { return {T * 3 * C, hd, 3 * C, 1}; }  // q, k, v rows
  std::vector<int64_t> in_rows() const { return {T * C, hd, C, 1}; }         // o, dO rows
  std::vector<int64_t> transposed() const { return {B, NH, hd, T}; }         // K^T, V^T views
  std::vector<int64_t> transposed_qkv() const { return {T * 3 * C, hd, 1, 3 * C}; }
  std::vector<int64_t> square() const { return {B, NH, T, T}; }
  std::vector<int64_t> square_strides() const { return {NH * T * T, T * T, T, 1}; }
  std::vector<int64_t> square_transposed() const { return {NH * T * T, T * T, 1, T}; }
  std::vector<int64_t> row() const { return {B, NH, T, 1}; }
  std::vector<int64_t> row_strides() const { return {NH * T, T, 1, 1}; }
  std::vector<int64_t> dense() const { return {NH * T * hd, T * hd, hd, 1}; }
};

// The value cuDNN's masks fill in: -inf from 9.10 on, the lowest float before.
float masked_value() {
  return cudnn_version() >= 91000 ? -std::numeric_limits<float>::infinity()
                                  : std::numeric_limits<float>::lowest();
}

// Applies the causal mask to `scores` (a virtual [B, NH, T, T] float tensor): keeps
// scores[t, s] where t >= s, else the masked value.
Uid causal_mask(Graph& g, const Layout& L, Uid scores, Uid masked_value) {
  const Uid row = g.tensor(CUDNN_DATA_INT32, L.square(), L.square_strides(), true);
  const Uid col = g.tensor(CUDNN_DATA_INT32, L.square(), L.square_strides(), true);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, scores, row, -1, -1, CUDNN_DATA_INT32, 2);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, scores, col, -1, -1, CUDNN_DATA_INT32, 3);
  const Uid keep = g.tensor(CUDNN_DATA_BOOLEAN, L.square(), L.square_strides(), true);
  g.pointwise(CUDNN_POINTWISE_CMP_GE, row, keep, col, -1, CUDNN_DATA_BOOLEAN);
  const Uid out = g.tensor(CUDNN_DATA_FLOAT, L.square(), L.square_strides(), true);
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, scores, out, masked_value, keep);
  return out;
}

// A virtual float tensor shaped like the score matrix or like a score row.
Uid scores(Graph& g, const Layout& L) {
  return g.tensor(CUDNN_DATA_FLOAT, L.square(), L.square_strides(), true);
}
Uid row(Graph& g, const Layout& L) {
  return g.tensor(CUDNN_DATA_FLOAT, L.row(), L.row_strides(), true);
}

struct Forward {
  Graph graph;
  Plan plan;
  Uid q, kt, v, o, stats, scale, masked;
};

std::unique_ptr<Forward> build_forward(const Layout& L) {
  auto f = std::make_unique<Forward>();
  Graph& g = f->graph;
  f->q = g.tensor(CUDNN_DATA_BFLOAT16, L.heads(), L.in_qkv());
  f->kt = g.tensor(CUDNN_DATA_BFLOAT16, L.transposed(), L.transposed_qkv());
  f->v = g.tensor(CUDNN_DATA_BFLOAT16, L.heads(), L.in_qkv());
  f->o = g.tensor(CUDNN_DATA_BFLOAT16, L.heads(), L.in_rows());
  f->stats = g.tensor(CUDNN_DATA_FLOAT, L.row(), L.row_strides());
  f->scale = g.scalar(CUDNN_DATA_FLOAT);
  f->masked = g.scalar(CUDNN_DATA_FLOAT);

  const Uid s = scores(g, L), scaled = scores(g, L);
  g.matmul(f->q, f->kt, s);
  g.pointwise(CUDNN_POINTWISE_MUL, s, scaled, f->scale);
  const Uid masked = causal_mask(g, L, scaled, f->masked);
  // softmax with statistics: m = max, e = exp(s - m), z = sum e, stats = m + log z, p = e / z
  const Uid m = row(g, L), shifted = scores(g, L), e = scores(g, L), z = row(g, L),
            log_z = row(g, L);
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, masked, m);
  g.pointwise(CUDNN_POINTWISE_SUB, masked, shifted, m);
  g.pointwise(CUDNN_POINTWISE_EXP, shifted, e);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, z);
  g.pointwise(CUDNN_POINTWISE_LOG, z, log_z);
  g.pointwise(CUDNN_POINTWISE_ADD, m, f->stats, log_z);
  // P enters the second GEMM in the operands' type, as the fused engine requires.
  const Uid p = g.tensor(CUDNN_DATA_BFLOAT16, L.square(), L.square_strides(), true);
  g.pointwise(CUDNN_POINTWISE_DIV, e, p, z);
  g.matmul(p, f->v, f->o);
  f->plan = g.plan("SDPA forward");
  return f;
}

struct Backward {
  Graph graph;
  Plan plan;
  Uid q, kt, vt, o, dout, stats, dq, dk, dv, softmax_sum, dq_accum = -1, scale, one, masked;
};

// `ordered_dq`: dQ straight out of its GEMM (cuDNN's deterministic, dP-workspace form); without
// it dQ goes through a float accumulator that the engine fills with atomics.
std::unique_ptr<Backward> build_backward(const Layout& L, bool ordered_dq) {
  auto b = std::make_unique<Backward>();
  Graph& g = b->graph;
  b->q = g.tensor(CUDNN_DATA_BFLOAT16, L.heads(), L.in_qkv());
  b->kt = g.tensor(CUDNN_DATA_BFLOAT16, L.transposed(), L.transposed_qkv());
  b->vt = g.tensor(CUDNN_DATA_BFLOAT16, L.transposed(), L.transposed_qkv());
  b->o = g.tensor(CUDNN_DATA_BFLOAT16, L.heads(), L.in_rows());
  b->dout = g.tensor(CUDNN_DATA_BFLOAT16, L.heads(), L.in_rows());
  b->stats = g.tensor(CUDNN_DATA_FLOAT, L.row(), L.row_strides());
  b->dq = g.tensor(CUDNN_DATA_BFLOAT16, L.heads(), L.in_qkv());
  b->dk = g.tensor(CUDNN_DATA_BFLOAT16, L.heads(), L.in_qkv());
  b->dv = g.tensor(CUDNN_DATA_BFLOAT16, L.heads(), L.in_qkv());
  b->softmax_sum = g.tensor(CUDNN_DATA_FLOAT, L.row(), L.row_strides());
  b->scale = g.scalar(CUDNN_DATA_FLOAT);
  b->one = g.scalar(CUDNN_DATA_FLOAT);
  b->masked = g.scalar(CUDNN_DATA_FLOAT);

  // D = rowsum(dO * O), kept in a float workspace tensor
  const Uid prod = g.tensor(CUDNN_DATA_FLOAT, L.heads(), L.dense(), true), d = row(g, L);
  g.pointwise(CUDNN_POINTWISE_MUL, b->dout, prod, b->o);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, prod, d);
  g.pointwise(CUDNN_POINTWISE_MUL, d, b->softmax_sum, b->one);
  // P = exp(scale Q K^T - stats) under the causal mask
  const Uid s = scores(g, L), scaled = scores(g, L), centred = scores(g, L), p = scores(g, L);
  g.matmul(b->q, b->kt, s);
  g.pointwise(CUDNN_POINTWISE_MUL, s, scaled, b->scale);
  g.pointwise(CUDNN_POINTWISE_SUB, scaled, centred, b->stats);
  const Uid masked = causal_mask(g, L, centred, b->masked);
  g.pointwise(CUDNN_POINTWISE_EXP, masked, p);
  // dV = P^T dO
  const Uid pt = g.tensor(CUDNN_DATA_BFLOAT16, L.square(), L.square_transposed(), true);
  g.reshape(p, pt);
  g.matmul(pt, b->dout, b->dv);
  // dS = P (dO V^T - D) scale
  const Uid dp = scores(g, L), dp1 = scores(g, L), dp2 = scores(g, L), ds = scores(g, L),
            ds_scaled = scores(g, L);
  g.matmul(b->dout, b->vt, dp);
  g.pointwise(CUDNN_POINTWISE_MUL, dp, dp1, b->one);
  g.pointwise(CUDNN_POINTWISE_SUB, dp1, dp2, b->softmax_sum);
  g.pointwise(CUDNN_POINTWISE_MUL, dp2, ds, p);
  g.pointwise(CUDNN_POINTWISE_MUL, ds, ds_scaled, b->scale);
  // dK = dS^T Q
  const Uid dst = g.tensor(CUDNN_DATA_BFLOAT16, L.square(), L.square_transposed(), true);
  g.reshape(ds_scaled, dst);
  g.matmul(dst, b->q, b->dk);
  // dQ = dS K
  const Uid k = g.tensor(CUDNN_DATA_BFLOAT16, L.heads(), L.in_qkv(), true);
  g.reshape(b->kt, k);
  if (ordered_dq) {
    g.matmul(ds_scaled, k, b->dq);
  } else {
    b->dq_accum = g.tensor(CUDNN_DATA_FLOAT, L.heads(), L.dense());
    g.matmul(ds_scaled, k, b->dq_accum);
    g.pointwise(CUDNN_POINTWISE_IDENTITY, b->dq_accum, b->dq);
  }
  b->plan = g.plan(ordered_dq ? "SDPA backward (ordered dQ)" : "SDPA backward");
  return b;
}

using Key = std::tuple<int, int, int, int>;
std::mutex g_mutex;

// A cuDNN without an engine for a graph (another version or GPU) stops the run naming the way
// around it, rather than silently switching kernels under a reference.
[[noreturn]] void no_engine(const CudaError& e) {
  throw CudaError(std::string(e.what()) +
                  "; kernels.attention_forward = \"batched_gemm\" runs the batched-GEMM "
                  "attention instead");
}

Forward& forward_plan(int B, int T_, int C, int NH) {
  static std::map<Key, std::unique_ptr<Forward>> cache;
  std::lock_guard<std::mutex> lock(g_mutex);
  auto& slot = cache[Key{B, T_, C, NH}];
  if (!slot) {
    try {
      slot = build_forward(Layout(B, T_, C, NH));
    } catch (const CudaError& e) {
      no_engine(e);
    }
  }
  return *slot;
}

// The ordered-dQ graph when an engine takes it, else the accumulator form.
Backward& backward_plan(int B, int T_, int C, int NH) {
  static std::map<Key, std::unique_ptr<Backward>> cache;
  std::lock_guard<std::mutex> lock(g_mutex);
  auto& slot = cache[Key{B, T_, C, NH}];
  if (!slot) {
    const Layout L(B, T_, C, NH);
    try {
      slot = build_backward(L, true);
    } catch (const CudaError&) {
      try {
        slot = build_backward(L, false);
      } catch (const CudaError& e) {
        no_engine(e);
      }
    }
  }
  return *slot;
}

void* workspace(const OpContext& ctx, const Plan& plan) {
  return plan.workspace_bytes ? scratch(ctx, Scratch::Cudnn, size_t(plan.workspace_bytes))
                              : nullptr;
}

}  // namespace

std::string cudnn_sdpa_unsupported(int T_, int C, int NH, bool backward) {
  const int hd = C / NH;
  if (hd % 8 != 0 || hd > 128)
    return "cuDNN SDPA needs a head size that is a multiple of 8 and at most 128 (got " +
           std::to_string(hd) + ")";
  if (backward && cudnn_version() < 91600 && T_ % 128 != 0)
    return "cuDNN " + std::to_string(cudnn_version()) +
           " SDPA backward needs seq_len a multiple of 128 (got " + std::to_string(T_) + ")";
  return "";
}

namespace {
void run_forward(const Forward& f, const Plan& plan, const OpContext& ctx, __nv_bfloat16* o,
                 float* stats, const __nv_bfloat16* qkv, int C, int NH) {
  float scale = 1.0f / std::sqrt(float(C / NH)), masked = masked_value();
  auto* in = const_cast<__nv_bfloat16*>(qkv);
  execute(plan,
          {{f.q, in},
           {f.kt, in + C},
           {f.v, in + 2 * C},
           {f.o, o},
           {f.stats, stats},
           {f.scale, &scale},
           {f.masked, &masked}},
          workspace(ctx, plan), ctx);
}

void run_backward(const Backward& b, const Plan& plan, const OpContext& ctx, __nv_bfloat16* dqkv,
                  const __nv_bfloat16* qkv, const __nv_bfloat16* o, const float* stats,
                  const __nv_bfloat16* dout, int B, int T_, int C, int NH) {
  const size_t rows = size_t(B) * NH * T_;
  float* sum = scratch_as<float>(ctx, Scratch::CudnnRows, rows);
  float* accum = nullptr;
  if (b.dq_accum >= 0) {
    accum = scratch_as<float>(ctx, Scratch::CudnnAccum, size_t(B) * T_ * C);
    DIVLAB_CUDA_CHECK(cudaMemsetAsync(accum, 0, size_t(B) * T_ * C * sizeof(float)));
  }
  float scale = 1.0f / std::sqrt(float(C / NH)), one = 1.0f, masked = masked_value();
  auto* in = const_cast<__nv_bfloat16*>(qkv);
  std::vector<std::pair<Uid, void*>> bind = {{b.q, in},
                                             {b.kt, in + C},
                                             {b.vt, in + 2 * C},
                                             {b.o, const_cast<__nv_bfloat16*>(o)},
                                             {b.dout, const_cast<__nv_bfloat16*>(dout)},
                                             {b.stats, const_cast<float*>(stats)},
                                             {b.dq, dqkv},
                                             {b.dk, dqkv + C},
                                             {b.dv, dqkv + 2 * C},
                                             {b.softmax_sum, sum},
                                             {b.scale, &scale},
                                             {b.one, &one},
                                             {b.masked, &masked}};
  if (accum) bind.push_back({b.dq_accum, accum});
  execute(plan, bind, workspace(ctx, plan), ctx);
}

__global__ void fill_random(__nv_bfloat16* p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    unsigned x = unsigned(i) * 2654435761u ^ seed;
    x ^= x >> 13, x *= 0x5bd1e995u, x ^= x >> 15;
    p[i] = __float2bfloat16(float(x & 0xffffu) / 32768.0f - 1.0f);
  }
}

template <class T>
std::vector<T> to_host(const OpContext& ctx, const T* p, size_t n) {
  std::vector<T> h(n);
  DIVLAB_CUDA_CHECK(cudaStreamSynchronize(stream_of(ctx)));
  DIVLAB_CUDA_CHECK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}
}  // namespace

void cudnn_sdpa_forward(const OpContext& ctx, __nv_bfloat16* o, float* stats,
                        const __nv_bfloat16* qkv, int B, int T_, int C, int NH) {
  Forward& f = forward_plan(B, T_, C, NH);
  run_forward(f, f.plan, ctx, o, stats, qkv, C, NH);
}

void cudnn_sdpa_backward(const OpContext& ctx, __nv_bfloat16* dqkv, const __nv_bfloat16* qkv,
                         const __nv_bfloat16* o, const float* stats, const __nv_bfloat16* dout,
                         int B, int T_, int C, int NH) {
  Backward& b = backward_plan(B, T_, C, NH);
  run_backward(b, b.plan, ctx, dqkv, qkv, o, stats, dout, B, T_, C, NH);
}

std::vector<SdpaCandidate> cudnn_sdpa_candidates(const OpContext& ctx, bool backward, int B, int T_,
                                                 int C, int NH, int reps) {
  const size_t N = size_t(B) * T_, rows = size_t(B) * NH * T_;
  __nv_bfloat16 *qkv = nullptr, *o = nullptr, *dout = nullptr, *dqkv = nullptr;
  float* stats = nullptr;
  DIVLAB_CUDA_CHECK(cudaMalloc(&qkv, N * 3 * C * 2));
  DIVLAB_CUDA_CHECK(cudaMalloc(&dqkv, N * 3 * C * 2));
  DIVLAB_CUDA_CHECK(cudaMalloc(&o, N * C * 2));
  DIVLAB_CUDA_CHECK(cudaMalloc(&dout, N * C * 2));
  DIVLAB_CUDA_CHECK(cudaMalloc(&stats, rows * 4));
  fill_random<<<1024, 256, 0, stream_of(ctx)>>>(qkv, N * 3 * C, 1);
  fill_random<<<1024, 256, 0, stream_of(ctx)>>>(dout, N * C, 2);
  Forward& f = forward_plan(B, T_, C, NH);
  run_forward(f, f.plan, ctx, o, stats, qkv, C, NH);
  std::vector<SdpaCandidate> out;
  // Each configuration: one call's outputs against the first plan's, then `reps` calls timed.
  const auto measure = [&](const Graph& g, const std::string& what, bool ordered, auto&& call,
                           auto&& outputs) {
    const auto first = outputs();
    g.visit_plans(what, {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_B, CUDNN_HEUR_MODE_FALLBACK},
                  [&](const Plan& p) {
                    call(p);
                    SdpaCandidate c{p.engine, p.deterministic && ordered, outputs() == first, 0};
                    c.ms = 1e3 *
                           device_seconds(stream_of(ctx),
                                          [&] {
                                            for (int r = 0; r < reps; ++r) call(p);
                                          }) /
                           reps;
                    out.push_back(c);
                    return false;
                  });
  };
  if (!backward) {
    measure(
        f.graph, "SDPA forward", true,
        [&](const Plan& p) { run_forward(f, p, ctx, o, stats, qkv, C, NH); },
        [&] { return std::make_pair(to_host(ctx, o, N * C), to_host(ctx, stats, rows)); });
  } else {
    Backward& b = backward_plan(B, T_, C, NH);
    run_backward(b, b.plan, ctx, dqkv, qkv, o, stats, dout, B, T_, C, NH);
    measure(
        b.graph, "SDPA backward", b.dq_accum < 0,
        [&](const Plan& p) { run_backward(b, p, ctx, dqkv, qkv, o, stats, dout, B, T_, C, NH); },
        [&] { return to_host(ctx, dqkv, N * 3 * C); });
  }
  for (void* p : {static_cast<void*>(qkv), static_cast<void*>(dqkv), static_cast<void*>(o),
                  static_cast<void*>(dout), static_cast<void*>(stats)})
    DIVLAB_CUDA_CHECK(cudaFree(p));
  return out;
}

bool cudnn_sdpa_backward_deterministic(int B, int T_, int C, int NH, std::string* engine) {
  Backward& b = backward_plan(B, T_, C, NH);
  if (engine)
    *engine = b.plan.engine + (b.dq_accum >= 0 ? " (dQ accumulator)" : " (ordered dQ)") +
              ", workspace " + std::to_string(b.plan.workspace_bytes) + " bytes";
  return b.plan.deterministic && b.dq_accum < 0;
}

}  // namespace divlab::cuda
