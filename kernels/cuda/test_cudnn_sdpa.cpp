// The bf16-mode attention reference where it is cuDNN's fused SDPA, against the fp64 CPU
// reference on head sizes 32 and 64; its backward's run-to-run bits; the batched-GEMM fallback
// where the engines do not take the shape; and the pairing rule that keeps a forward that saves
// probabilities from running with the fused backward, which reads none.
#include <cuda_runtime.h>

#include <cmath>
#include <random>

#include "kernels/attention/cudnn_sdpa.h"
#include "kernels/cuda/runtime.h"
#include "tests/gpu/gpu_check.h"

namespace divlab {
using namespace testing;

namespace {
#define OP_CALL [&](const auto& k, auto& in, const TokenId*, auto& out)

struct Shape {
  int B, T, C, NH;
};

KernelSet<float, bf16> bf16_reference() {
  return gpu_catalogue<bf16>().select({});
}

// The forward's output against fp64. *saved_probabilities: whether it wrote the att buffer
// (the batched path does; the fused one saves none).
double forward_error(const Shape& s, std::mt19937_64& gen, bool* saved_probabilities) {
  const size_t N = size_t(s.B) * s.T;
  const OpInputs x{{randn<double>(N * 3 * s.C, gen)},
                   {},
                   {zeros(N * s.C), zeros(size_t(s.B) * s.NH * s.T * s.T)}};
  auto call = OP_CALL {
    k.attention_forward(test_context(*k.memory), out[0], out[1], in[0], s.B, s.T, s.C, s.NH);
  };
  const auto ref = run_checked<double>(cpu_catalogue<double>().select({}), x, call);
  const auto got = run_checked<float>(bf16_reference(), x, call);
  *saved_probabilities = false;
  for (double v : got[1]) *saved_probabilities |= v != 0.0;
  return compare(got[0], ref[0]).error;
}

// dqkv against the fp64 reference backward at the CPU reference forward's saved state.
double backward_error(const Shape& s, std::mt19937_64& gen, std::vector<double>* dqkv = nullptr) {
  const size_t N = size_t(s.B) * s.T;
  const OpInputs fwd{{randn<double>(N * 3 * s.C, gen)},
                     {},
                     {zeros(N * s.C), zeros(size_t(s.B) * s.NH * s.T * s.T)}};
  const auto saved = run_checked<double>(
      cpu_catalogue<double>().select({}), fwd, OP_CALL {
        k.attention_forward(test_context(*k.memory), out[0], out[1], in[0], s.B, s.T, s.C, s.NH);
      });
  const OpInputs x{
      {randn<double>(N * s.C, gen), fwd.values[0], saved[1]}, {}, {zeros(N * 3 * s.C)}};
  auto call = OP_CALL {
    k.attention_backward(test_context(*k.memory), out[0], in[0], in[1], in[2], s.B, s.T, s.C, s.NH);
  };
  const auto ref = run_checked<double>(cpu_catalogue<double>().select({}), x, call);
  const auto got = run_checked<float>(bf16_reference(), x, call);
  if (dqkv) *dqkv = got[0];
  return compare(got[0], ref[0]).error;
}
}  // namespace

TEST(CudnnSdpa, ForwardMatchesFp64) {
  REQUIRE_GPU();
  std::mt19937_64 gen(test_seed());
  for (const Shape& s : {Shape{2, 128, 128, 2}, Shape{3, 128, 128, 4}, Shape{2, 256, 64, 1}}) {
    bool saved = true;
    const double e = forward_error(s, gen, &saved);
    std::printf("cudnn_sdpa forward B%d T%d C%d NH%d: normalised error %.3g\n", s.B, s.T, s.C, s.NH,
                e);
    EXPECT_LT(e, kTolGpuBf16) << "T " << s.T << " C " << s.C << " NH " << s.NH;
    EXPECT_FALSE(saved) << "the fused forward wrote probabilities: it did not run";
  }
  // Head size 18, and (before cuDNN 9.16) a seq_len off the 128-row tiles: batched GEMMs, which
  // save the probabilities.
  for (const Shape& s : {Shape{2, 128, 72, 4}, Shape{2, 100, 64, 1}}) {
    bool saved = false;
    EXPECT_LT(forward_error(s, gen, &saved), kTolGpuBf16);
    EXPECT_EQ(saved, !cuda::cudnn_sdpa_unsupported(s.T, s.C, s.NH, true).empty()) << s.T;
  }
}

TEST(CudnnSdpa, BackwardMatchesFp64AndRepeatsBitForBit) {
  REQUIRE_GPU();
  std::mt19937_64 gen(test_seed());
  for (const Shape& s : {Shape{2, 128, 128, 2}, Shape{3, 256, 128, 4}}) {
    ASSERT_EQ(cuda::cudnn_sdpa_unsupported(s.T, s.C, s.NH, true), "");
    std::vector<double> first, second;
    std::mt19937_64 again = gen;
    const double e = backward_error(s, gen, &first);
    backward_error(s, again, &second);
    std::string engine;
    const bool deterministic =
        cuda::cudnn_sdpa_backward_deterministic(s.B, s.T, s.C, s.NH, &engine);
    std::printf("cudnn_sdpa backward B%d T%d C%d NH%d: normalised error %.3g, %s, %s, %s\n", s.B,
                s.T, s.C, s.NH, e, engine.c_str(),
                deterministic ? "declared deterministic" : "declared nondeterministic",
                first == second ? "bitwise repeatable here" : "NOT bitwise repeatable");
    EXPECT_LT(e, kTolGpuBf16) << "T " << s.T;
    if (deterministic) {
      EXPECT_EQ(first, second) << "a deterministic engine changed its bits";
    }
  }
}

// The fused engines store with the Tensor Memory Accelerator, whose writes compute-sanitizer's
// initcheck does not see (it flags our widening kernel's reads of them). So every output is
// checked here instead: buffers filled with NaN first, all of them finite afterwards.
TEST(CudnnSdpa, WritesEveryOutputElement) {
  REQUIRE_GPU();
  const int B = 2, T = 128, C = 128, NH = 2;
  const size_t n = size_t(B) * T * C, rows = size_t(B) * NH * T;
  std::mt19937_64 gen(test_seed());
  auto upload = [&](size_t count) {
    std::vector<__nv_bfloat16> h(count);
    std::vector<double> values = randn<double>(count, gen);
    for (size_t i = 0; i < count; ++i) h[i] = __float2bfloat16(float(values[i]));
    __nv_bfloat16* d = nullptr;
    EXPECT_EQ(cudaMalloc(&d, count * sizeof(__nv_bfloat16)), cudaSuccess);
    cudaMemcpy(d, h.data(), count * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice);
    return d;
  };
  auto poisoned = [](size_t bytes) {
    void* d = nullptr;
    EXPECT_EQ(cudaMalloc(&d, bytes), cudaSuccess);
    cudaMemset(d, 0xFF, bytes);  // NaN as bf16 and as float
    return d;
  };
  __nv_bfloat16 *qkv = upload(3 * n), *dout = upload(n);
  auto* o = static_cast<__nv_bfloat16*>(poisoned(n * 2));
  auto* stats = static_cast<float*>(poisoned(rows * 4));
  auto* dqkv = static_cast<__nv_bfloat16*>(poisoned(3 * n * 2));
  cuda::cudnn_sdpa_forward(test_context(cuda::device_memory()), o, stats, qkv, B, T, C, NH);
  cuda::cudnn_sdpa_backward(test_context(cuda::device_memory()), dqkv, qkv, o, stats, dout, B, T, C,
                            NH);
  auto count_nan = [](const void* d, size_t count, bool is_float) {
    std::vector<unsigned char> h(count * (is_float ? 4 : 2));
    cudaMemcpy(h.data(), d, h.size(), cudaMemcpyDeviceToHost);
    size_t bad = 0;
    for (size_t i = 0; i < count; ++i) {
      const float v = is_float
                          ? reinterpret_cast<const float*>(h.data())[i]
                          : __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(h.data())[i]);
      bad += !std::isfinite(v);
    }
    return bad;
  };
  EXPECT_EQ(count_nan(o, n, false), 0u);
  EXPECT_EQ(count_nan(stats, rows, true), 0u);
  EXPECT_EQ(count_nan(dqkv, 3 * n, false), 0u);
  for (void* p : {(void*)qkv, (void*)dout, (void*)o, (void*)stats, (void*)dqkv}) cudaFree(p);
}

// Catalogue only: needs no GPU, so it also runs where the cuda preset is only built (CI).
TEST(CudnnSdpa, ForwardsThatSaveProbabilitiesBringTheirBackward) {
  const auto& cat = gpu_catalogue<bf16>();
  for (const char* v : {"batched_gemm", "mask_off_by_one", "no_max_subtraction"}) {
    EXPECT_EQ(cat.select({{"attention_forward", v}}).attention_backward,
              cat.attention_backward.find("batched_gemm")->fn)
        << v;
    EXPECT_THROW(cat.select({{"attention_forward", v}, {"attention_backward", "reference"}}),
                 UnknownKernel)
        << v;
  }
  // The backward that reads probabilities brings a forward that saves them, and refuses the
  // fused reference forward, which saves none.
  EXPECT_EQ(cat.select({{"attention_backward", "batched_gemm"}}).attention_forward,
            cat.attention_forward.find("batched_gemm")->fn);
  EXPECT_THROW(
      cat.select({{"attention_forward", "reference"}, {"attention_backward", "batched_gemm"}}),
      UnknownKernel);
  // The reference pair stays together by default.
  const auto k = cat.select({});
  EXPECT_EQ(k.attention_backward, cat.attention_backward.find("reference")->fn);
  // Head sizes the fused engines do not take are named.
  EXPECT_NE(cuda::cudnn_sdpa_unsupported(37, 72, 4, false).find("head size"), std::string::npos);
}

}  // namespace divlab
