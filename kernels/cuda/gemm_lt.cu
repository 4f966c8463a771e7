// cuBLASLt GEMMs with a bit-neutral choice of algorithm (kernels/cuda/gemm_lt.h says why and how).
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cuda/gemm_lt.h"
#include "kernels/cuda/runtime.h"

namespace divlab::cuda {

namespace {
cublasLtHandle_t cublas_lt() {
  static cublasLtHandle_t handle = [] {
    cublasLtHandle_t h = nullptr;
    DIVLAB_CUBLAS_CHECK(cublasLtCreate(&h));
    return h;
  }();
  return handle;
}

int alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  int bytes = 256;
  while (bytes > 1 && a % uintptr_t(bytes) != 0) bytes /= 2;
  return bytes;
}

int element_bytes(cudaDataType_t t) {
  return t == CUDA_R_16BF ? 2 : 4;
}

// The matmul and layout descriptors of one problem (the real one, or its probe).
class Descriptors {
 public:
  Descriptors(const GemmShape& s, int m, int n, int lda, int ldb, int ldc) {
    try {
      DIVLAB_CUBLAS_CHECK(cublasLtMatmulDescCreate(&op_, CUBLAS_COMPUTE_32F, CUDA_R_32F));
      DIVLAB_CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSA, &s.ta, sizeof s.ta));
      DIVLAB_CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSB, &s.tb, sizeof s.tb));
      const bool an = s.ta == CUBLAS_OP_N, bn = s.tb == CUBLAS_OP_N;
      DIVLAB_CUBLAS_CHECK(
          cublasLtMatrixLayoutCreate(&a_, s.in, an ? m : s.k, an ? s.k : m, int64_t(lda)));
      DIVLAB_CUBLAS_CHECK(
          cublasLtMatrixLayoutCreate(&b_, s.in, bn ? s.k : n, bn ? n : s.k, int64_t(ldb)));
      DIVLAB_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&c_, s.out, m, n, int64_t(ldc)));
    } catch (...) {
      release();
      throw;
    }
  }
  Descriptors(const Descriptors&) = delete;
  Descriptors& operator=(const Descriptors&) = delete;
  ~Descriptors() { release(); }

  void run(const OpContext& ctx, const cublasLtMatmulAlgo_t& algo, float alpha, const void* A,
           const void* B, float beta, void* C) const {
    DIVLAB_CUBLAS_CHECK(cublasLtMatmul(cublas_lt(), op_, &alpha, A, a_, B, b_, &beta, C, c_, C, c_,
                                       &algo, cublas_workspace(ctx), kCublasWorkspaceBytes,
                                       stream_of(ctx)));
  }
  bool takes(const cublasLtMatmulAlgo_t& algo) const {
    cublasLtMatmulHeuristicResult_t r{};
    return cublasLtMatmulAlgoCheck(cublas_lt(), op_, a_, b_, c_, c_, &algo, &r) ==
               CUBLAS_STATUS_SUCCESS &&
           r.workspaceSize <= kCublasWorkspaceBytes;
  }
  cublasLtMatmulDesc_t op() const { return op_; }
  cublasLtMatrixLayout_t a() const { return a_; }
  cublasLtMatrixLayout_t b() const { return b_; }
  cublasLtMatrixLayout_t c() const { return c_; }

 private:
  void release() {  // never throws: the destructor's
    if (c_) cublasLtMatrixLayoutDestroy(c_);
    if (b_) cublasLtMatrixLayoutDestroy(b_);
    if (a_) cublasLtMatrixLayoutDestroy(a_);
    if (op_) cublasLtMatmulDescDestroy(op_);
    c_ = b_ = a_ = nullptr, op_ = nullptr;
  }

  cublasLtMatmulDesc_t op_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, c_ = nullptr;
};

constexpr int kCandidates = 16;

struct Plan {
  std::unique_ptr<Descriptors> real;
  std::vector<cublasLtMatmulAlgo_t> candidates;  // the heuristic's order
  std::vector<int> agreeing;                     // probed: bits equal to candidate 0's
  bool probed = false;
  int chosen = 0;
  bool tuned = false;
};

std::mutex plans_mutex;
std::map<GemmShape, Plan>& plans() {
  static std::map<GemmShape, Plan> p;
  return p;
}

// The algorithms cuBLASLt's heuristic offers for the problem `d` describes (at most `most`), in its
// order, with split-K partial sums reduced by one of `schemes`.
std::vector<cublasLtMatmulAlgo_t> heuristic(const GemmShape& s, const Descriptors& d,
                                            uint32_t schemes, int most) {
  cublasLtMatmulPreference_t pref = nullptr;
  DIVLAB_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t workspace = kCublasWorkspaceBytes;
  const uint32_t align[] = {uint32_t(s.align_a), uint32_t(s.align_b), uint32_t(s.align_c)};
  std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<size_t>(most));
  int found = 0;
  const auto set = [&](cublasLtMatmulPreferenceAttributes_t a, const void* v, size_t bytes) {
    return cublasLtMatmulPreferenceSetAttribute(pref, a, v, bytes);
  };
  cublasStatus_t st = set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof workspace);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = set(CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes, sizeof schemes);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align[0], sizeof align[0]);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align[1], sizeof align[1]);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align[2], sizeof align[2]);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align[2], sizeof align[2]);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulAlgoGetHeuristic(cublas_lt(), d.op(), d.a(), d.b(), d.c(), d.c(), pref, most,
                                        results.data(), &found);
  cublasLtMatmulPreferenceDestroy(pref);
  DIVLAB_CUBLAS_CHECK(st);
  std::vector<cublasLtMatmulAlgo_t> algos;
  for (int i = 0; i < found; ++i)
    if (results[size_t(i)].state == CUBLAS_STATUS_SUCCESS) algos.push_back(results[size_t(i)].algo);
  return algos;
}

// Split K only with the partial sums kept in fp32 (the compute type) in the workspace: the
// in-place and output-type schemes add them in the output's type (bf16 for activations).
constexpr uint32_t kFullPrecisionSchemes =
    CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;

Plan make_plan(const GemmShape& s) {
  Plan p;
  p.real = std::make_unique<Descriptors>(s, s.m, s.n, s.lda, s.ldb, s.ldc);
  p.candidates = heuristic(s, *p.real, kFullPrecisionSchemes, kCandidates);
  if (p.candidates.empty())
    throw CudaError("cuBLASLt offers no algorithm for a " + std::to_string(s.m) + " x " +
                    std::to_string(s.n) + " x " + std::to_string(s.k) + " GEMM");
  return p;
}

// Caller holds plans_mutex.
Plan& plan_for(const GemmShape& s) {
  auto it = plans().find(s);
  if (it == plans().end()) it = plans().emplace(s, make_plan(s)).first;
  return it->second;
}

// Random operands in [-1, 1) from a hash of the index (bf16 or fp32).
__global__ void fill_random(void* p, int64_t n, bool bf16_values, uint32_t seed) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t x = uint32_t(i) * 2654435761u ^ seed;
    x ^= x >> 13, x *= 0x5bd1e995u, x ^= x >> 15;
    const float v = float(x & 0xffffu) / 32768.0f - 1.0f;
    if (bf16_values)
      static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
    else
      static_cast<float*>(p)[i] = v;
  }
}

// Device memory for the tuner's own use, released on the op's stream when done.
class TunerMemory {
 public:
  TunerMemory(const OpContext& ctx, size_t bytes) : stream_(stream_of(ctx)) {
    if (cudaMallocAsync(&p_, bytes, stream_) != cudaSuccess) cudaGetLastError(), p_ = nullptr;
  }
  TunerMemory(const TunerMemory&) = delete;
  TunerMemory& operator=(const TunerMemory&) = delete;
  ~TunerMemory() {
    if (p_) cudaFreeAsync(p_, stream_);
  }
  void* get() const { return p_; }
  explicit operator bool() const { return p_ != nullptr; }

 private:
  cudaStream_t stream_;
  void* p_ = nullptr;
};

// The probe: the same K (how the sum is cut) and transposes, at most 128 x 128 outputs.
void probe(const OpContext& ctx, const GemmShape& s, Plan& p) {
  p.probed = true;
  p.agreeing = {0};
  if (p.candidates.size() < 2) return;
  const int m = std::min(s.m, 128), n = std::min(s.n, 128);
  const bool an = s.ta == CUBLAS_OP_N, bn = s.tb == CUBLAS_OP_N;
  const int lda = an ? m : s.k, ldb = bn ? s.k : n;
  const int64_t na = int64_t(lda) * (an ? s.k : m), nb = int64_t(ldb) * (bn ? n : s.k),
                nc = int64_t(m) * n;
  const size_t in = size_t(element_bytes(s.in)), out = size_t(element_bytes(s.out));
  TunerMemory a(ctx, size_t(na) * in), b(ctx, size_t(nb) * in), c0(ctx, size_t(nc) * out),
      c(ctx, size_t(nc) * out), init(ctx, size_t(nc) * out);
  if (!a || !b || !c0 || !c || !init) return;  // no memory to spare: the first choice alone
  const cudaStream_t stream = stream_of(ctx);
  const auto fill = [&](void* q, int64_t count, cudaDataType_t t, uint32_t seed) {
    fill_random<<<256, 256, 0, stream>>>(q, count, t == CUDA_R_16BF, seed);
    DIVLAB_LAUNCHED(ctx, "gemm probe operands");
  };
  fill(a.get(), na, s.in, 1), fill(b.get(), nb, s.in, 2), fill(init.get(), nc, s.out, 3);
  const Descriptors d(s, m, n, lda, ldb, m);
  const float alpha = 1.0f, beta = s.accumulate ? 1.0f : 0.0f;
  const size_t bytes = size_t(nc) * out;
  const auto output_of = [&](int i, void* into, std::vector<unsigned char>& host) {
    DIVLAB_CUDA_CHECK(cudaMemcpyAsync(into, init.get(), bytes, cudaMemcpyDeviceToDevice, stream));
    d.run(ctx, p.candidates[size_t(i)], alpha, a.get(), b.get(), beta, into);
    host.resize(bytes);
    DIVLAB_CUDA_CHECK(cudaMemcpyAsync(host.data(), into, bytes, cudaMemcpyDeviceToHost, stream));
    DIVLAB_CUDA_CHECK(cudaStreamSynchronize(stream));
  };
  if (!d.takes(p.candidates[0])) return;
  std::vector<unsigned char> want, got;
  output_of(0, c0.get(), want);
  for (int i = 1; i < int(p.candidates.size()); ++i) {
    if (!d.takes(p.candidates[size_t(i)])) continue;
    output_of(i, c.get(), got);
    if (got == want) p.agreeing.push_back(i);
  }
}

bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) {
    cudaGetLastError();
    return true;  // cannot tell: do nothing a capture forbids
  }
  return status != cudaStreamCaptureStatusNone;
}

// The tuner's timing (tune(), below): two rounds of kReps calls per candidate.
constexpr int kRounds = 2, kReps = 5;
constexpr double kMargin = 0.02;

// What DIVLAB_GEMM_TUNING asks for (0: off; 1 or unset: on; log: on, each decision on stderr),
// read once; experiments/main.cpp refuses other values before anything runs.
enum class TuningMode { off, on, logged };
TuningMode tuning_mode() {
  static const TuningMode mode = [] {
    const char* v = std::getenv("DIVLAB_GEMM_TUNING");
    if (v && std::string(v) == "0") return TuningMode::off;
    if (v && std::string(v) == "log") return TuningMode::logged;
    return TuningMode::on;
  }();
  return mode;
}

// One line per tuned shape: the problem, the candidates timed (those with the first choice's
// bits, by index in the heuristic's order) with their best time per call, and the one kept. What a
// timing decided, and how close it was, without a profiler (bench_gemm_tuning times the choices
// again on its own operands).
void log_decision(const GemmShape& s, const Plan& p, const std::vector<double>& best_seconds) {
  const auto op = [](cublasOperation_t t) { return t == CUBLAS_OP_N ? 'N' : 'T'; };
  std::string line = "divlab: gemm tuning: " + std::string{op(s.ta), op(s.tb)} + " m " +
                     std::to_string(s.m) + " n " + std::to_string(s.n) + " k " +
                     std::to_string(s.k) + (s.accumulate ? " (adds into C)" : "") + ", " +
                     std::to_string(p.candidates.size()) + " offered, us per call:";
  for (size_t j = 0; j < best_seconds.size(); ++j)
    line += " #" + std::to_string(p.agreeing[j]) + " " +
            std::to_string(int(std::lround(1e6 * best_seconds[j] / kReps)));
  if (best_seconds.empty())
    line += " none timed (" + std::to_string(p.agreeing.size()) + " with the first choice's bits)";
  line += "; runs #" + std::to_string(p.chosen);
  std::fprintf(stderr, "%s\n", line.c_str());
}

// Each agreeing candidate's time on the real problem, in p.agreeing's order: two rounds, each
// candidate's best round. A GEMM that only writes C runs into C itself (the final call
// overwrites it with the same bits); one that adds to C runs into a copy. Empty where there is
// nothing to choose between, or no memory for the copy.
std::vector<double> time_agreeing(const OpContext& ctx, const GemmShape& s, const Plan& p,
                                  float alpha, const void* A, const void* B, float beta, void* C) {
  if (p.agreeing.size() < 2) return {};
  const cudaStream_t stream = stream_of(ctx);
  const size_t bytes =
      (size_t(s.ldc) * size_t(s.n - 1) + size_t(s.m)) * size_t(element_bytes(s.out));
  std::unique_ptr<TunerMemory> copy;
  void* target = C;
  if (s.accumulate) {
    copy = std::make_unique<TunerMemory>(ctx, bytes);
    if (!*copy) return {};
    target = copy->get();
    DIVLAB_CUDA_CHECK(cudaMemcpyAsync(target, C, bytes, cudaMemcpyDeviceToDevice, stream));
  }
  std::vector<double> best(p.agreeing.size(), 0.0);
  for (int round = 0; round < kRounds; ++round)
    for (size_t j = 0; j < p.agreeing.size(); ++j) {
      const cublasLtMatmulAlgo_t& algo = p.candidates[size_t(p.agreeing[j])];
      p.real->run(ctx, algo, alpha, A, B, beta, target);  // warm-up
      const double seconds = device_seconds(stream, [&] {
        for (int r = 0; r < kReps; ++r) p.real->run(ctx, algo, alpha, A, B, beta, target);
      });
      if (round == 0 || seconds < best[j]) best[j] = seconds;
    }
  return best;
}

// Keeps the fastest agreeing candidate, the first choice unless another beats it by kMargin (a
// timing's noise must not swap algorithms for nothing).
void tune(const OpContext& ctx, const GemmShape& s, Plan& p, float alpha, const void* A,
          const void* B, float beta, void* C) {
  p.tuned = true;
  if (!p.probed) probe(ctx, s, p);
  const std::vector<double> best = time_agreeing(ctx, s, p, alpha, A, B, beta, C);
  size_t fastest = 0;
  for (size_t j = 1; j < best.size(); ++j)
    if (best[j] < best[fastest]) fastest = j;
  if (!best.empty() && best[fastest] < (1.0 - kMargin) * best[0]) p.chosen = p.agreeing[fastest];
  if (tuning_mode() == TuningMode::logged) log_decision(s, p, best);
}

// The plan of `s`, tuned first where it is due (tuning on, a GEMM large enough, not while
// capturing, not yet tuned). Caller holds plans_mutex.
Plan& tuned_plan(const OpContext& ctx, const GemmShape& s, float alpha, const void* A,
                 const void* B, float beta, void* C) {
  Plan& p = plan_for(s);
  if (!p.tuned && tuning_mode() != TuningMode::off && s.flops() >= kTunedFlops &&
      !capturing(stream_of(ctx)))
    tune(ctx, s, p, alpha, A, B, beta, C);
  return p;
}
}  // namespace

bool GemmShape::operator<(const GemmShape& o) const {
  const auto key = [](const GemmShape& g) {
    return std::make_tuple(int(g.ta), int(g.tb), g.m, g.n, g.k, g.lda, g.ldb, g.ldc, int(g.in),
                           int(g.out), g.accumulate, g.align_a, g.align_b, g.align_c);
  };
  return key(*this) < key(o);
}

GemmShape gemm_shape(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void* A,
                     int lda, cudaDataType_t in, const void* B, int ldb, cudaDataType_t out,
                     void* C, int ldc, bool accumulate) {
  GemmShape s;
  s.ta = ta, s.tb = tb, s.m = m, s.n = n, s.k = k, s.lda = lda, s.ldb = ldb, s.ldc = ldc;
  s.in = in, s.out = out, s.accumulate = accumulate;
  s.align_a = alignment_of(A), s.align_b = alignment_of(B), s.align_c = alignment_of(C);
  return s;
}

void gemm_lt(const OpContext& ctx, const GemmShape& s, float alpha, const void* A, const void* B,
             float beta, void* C) {
  if (s.m <= 0 || s.n <= 0) return;
  std::lock_guard<std::mutex> lock(plans_mutex);
  const Plan& p = tuned_plan(ctx, s, alpha, A, B, beta, C);
  p.real->run(ctx, p.candidates[size_t(p.chosen)], alpha, A, B, beta, C);
  if (debug_sync(ctx)) DIVLAB_CUDA_CHECK(cudaStreamSynchronize(stream_of(ctx)));
}

int gemm_candidate_count(const GemmShape& s) {
  std::lock_guard<std::mutex> lock(plans_mutex);
  return int(plan_for(s).candidates.size());
}

bool gemm_candidate_agrees(const OpContext& ctx, const GemmShape& s, int i) {
  std::lock_guard<std::mutex> lock(plans_mutex);
  Plan& p = plan_for(s);
  if (!p.probed) probe(ctx, s, p);
  return std::find(p.agreeing.begin(), p.agreeing.end(), i) != p.agreeing.end();
}

void gemm_with_candidate(const OpContext& ctx, const GemmShape& s, int i, float alpha,
                         const void* A, const void* B, float beta, void* C) {
  std::lock_guard<std::mutex> lock(plans_mutex);
  Plan& p = plan_for(s);
  if (i < 0 || i >= int(p.candidates.size()))
    throw std::out_of_range("gemm_with_candidate: no candidate " + std::to_string(i));
  p.real->run(ctx, p.candidates[size_t(i)], alpha, A, B, beta, C);
}

GemmAlgoInfo gemm_candidate_info(const GemmShape& s, int i) {
  std::lock_guard<std::mutex> lock(plans_mutex);
  const Plan& p = plan_for(s);
  if (i < 0 || i >= int(p.candidates.size()))
    throw std::out_of_range("gemm_candidate_info: no candidate " + std::to_string(i));
  const cublasLtMatmulAlgo_t& algo = p.candidates[size_t(i)];
  const auto get = [&](cublasLtMatmulAlgoConfigAttributes_t attr, auto zero) {
    decltype(zero) v = zero;
    size_t written = 0;
    cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, sizeof v, &written);
    return int(v);
  };
  GemmAlgoInfo info;
  info.id = get(CUBLASLT_ALGO_CONFIG_ID, int32_t(0));
  info.tile = get(CUBLASLT_ALGO_CONFIG_TILE_ID, uint32_t(0));
  info.stages = get(CUBLASLT_ALGO_CONFIG_STAGES_ID, uint32_t(0));
  info.split_k = get(CUBLASLT_ALGO_CONFIG_SPLITK_NUM, uint32_t(1));
  info.reduction = get(CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, uint32_t(0));
  info.swizzle = get(CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, uint32_t(0));
  info.cluster = get(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, uint16_t(0));
  return info;
}

int gemm_add_split_variants(const GemmShape& s, int of, const int* splits, int count) {
  std::lock_guard<std::mutex> lock(plans_mutex);
  Plan& p = plan_for(s);
  if (of < 0 || of >= int(p.candidates.size()))
    throw std::out_of_range("gemm_add_split_variants: no candidate " + std::to_string(of));
  int added = 0;
  for (int i = 0; i < count; ++i) {
    cublasLtMatmulAlgo_t algo = p.candidates[size_t(of)];
    const uint32_t split = uint32_t(splits[i]);
    const uint32_t scheme = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    if (cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split,
                                             sizeof split) != CUBLAS_STATUS_SUCCESS ||
        cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme,
                                             sizeof scheme) != CUBLAS_STATUS_SUCCESS ||
        !p.real->takes(algo))
      continue;
    p.candidates.push_back(algo);
    ++added;
  }
  return added;
}

int gemm_add_heuristic_candidates(const GemmShape& s, uint32_t schemes, int most) {
  std::lock_guard<std::mutex> lock(plans_mutex);
  Plan& p = plan_for(s);
  int added = 0;
  for (const cublasLtMatmulAlgo_t& algo : heuristic(s, *p.real, schemes, most)) {
    const auto same = [&](const cublasLtMatmulAlgo_t& a) {
      return std::memcmp(&a, &algo, sizeof a) == 0;
    };
    if (std::none_of(p.candidates.begin(), p.candidates.end(), same))
      p.candidates.push_back(algo), ++added;
  }
  return added;
}

int gemm_chosen_candidate(const OpContext& ctx, const GemmShape& s, float alpha, const void* A,
                          const void* B, float beta, void* C) {
  std::lock_guard<std::mutex> lock(plans_mutex);
  return tuned_plan(ctx, s, alpha, A, B, beta, C).chosen;
}

}  // namespace divlab::cuda
