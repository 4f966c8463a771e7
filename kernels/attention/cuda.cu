// Causal multi-head attention on the GPU. bf16 mode: cuDNN's fused SDPA where its engines take
// the shape (below). fp32 mode, and the `batched_gemm` pair in either mode: batched cuBLAS GEMMs
// around a causal softmax:
// scores = scale q k^T (fp32), softmax with the causal mask into att [B, NH, T, T] (stored as A,
// saved for the backward, like the CPU reference), y = att v. The GEMMs address each head in place
// (q, k, v as column blocks of the [N, 3C] qkv rows, y as column blocks of the [N, C] output;
// gemm_heads), so nothing is gathered or scattered. No atomics: bitwise deterministic.
#include "kernels/attention/cudnn_sdpa.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/storage.cuh"

namespace divlab::cuda {

namespace {
// One warp per score row (b, h, t): softmax over s <= t + lookahead, zeros beyond, from fp32
// scores into probabilities stored as A (in place where A is float).
template <int lookahead, bool subtract_max, class A>
__global__ void causal_softmax_kernel(A* att, const float* scores, int T_, int64_t rows) {
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int t = int(row % T_);
  const int last = min(T_ - 1, t + lookahead);
  const float* z = scores + row * T_;
  A* a = att + row * T_;
  float m = -INFINITY;
  if (subtract_max)
    for (int s = lane; s <= last; s += 32) m = fmaxf(m, z[s]);
  m = subtract_max ? warp_max(m) : 0.0f;
  float sum = 0;
  for (int s = lane; s <= last; s += 32) sum += expf(z[s] - m);
  sum = warp_sum(sum);
  const float inv = 1.0f / sum;
  for (int s = lane; s < T_; s += 32) a[s] = store<A>(s <= last ? expf(z[s] - m) * inv : 0.0f);
}

// dpre[t, s] = att[t, s] (datt[t, s] - sum_s' att[t, s'] datt[t, s']) * scale, from fp32 datt
// (in place where A is float).
template <class A>
__global__ void softmax_backward_kernel(A* dpre, const float* datt, const A* att, int T_,
                                        int64_t rows, float scale) {
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const A* p = att + row * T_;
  const float* d = datt + row * T_;
  A* out = dpre + row * T_;
  float dot = 0;
  for (int s = lane; s < T_; s += 32) dot += load(p[s]) * d[s];
  dot = warp_sum(dot);
  for (int s = lane; s < T_; s += 32) out[s] = store<A>(load(p[s]) * (d[s] - dot) * scale);
}

// Batch entry (b, h) of each operand: q, k, v in the qkv rows (row stride 3C), y and dy in
// the [N, C] rows (row stride C), att and datt as [B, NH, T, T].
struct HeadLayout {
  HeadStrides qkv, rows, square;
  HeadLayout(int T_, int C, int NH)
      : qkv{3LL * T_ * C, C / NH},
        rows{(long long)T_ * C, C / NH},
        square{(long long)NH * T_ * T_, (long long)T_ * T_} {}
};

// fp32 scores: att itself where A is float, else scratch.
template <class A>
float* score_buffer(const OpContext& ctx, A* att, size_t n, Scratch slot) {
  if constexpr (std::is_same_v<A, float>)
    return att;
  else
    return scratch_as<float>(ctx, slot, n);
}

template <int lookahead, bool subtract_max, class A>
void attention_forward(const OpContext& ctx, A* out, A* att, const A* qkv, int B, int T_, int C,
                       int NH) {
  const int hs = C / NH;
  const HeadLayout L(T_, C, NH);
  const A *q = qkv, *k = qkv + C, *v = qkv + 2 * C;
  const int64_t rows = int64_t(B) * NH * T_;
  float* scores = score_buffer(ctx, att, size_t(rows) * T_, Scratch::F);
  // scores^T[s, t] (column-major) = scale sum_d k[s, d] q[t, d]: row-major scores[t, s]
  gemm_heads(ctx, CUBLAS_OP_T, CUBLAS_OP_N, T_, T_, hs, 1.0f / sqrtf(float(hs)), k, 3 * C, L.qkv, q,
             3 * C, L.qkv, 0.0f, scores, T_, L.square, B, NH);
  causal_softmax_kernel<lookahead, subtract_max>
      <<<blocks_for(rows, 8), 256, 0, stream_of(ctx)>>>(att, scores, T_, rows);
  DIVLAB_LAUNCHED(ctx, "causal_softmax");
  // y^T[d, t] = sum_s v[s, d] att[t, s], into head h's columns of out's rows
  gemm_heads(ctx, CUBLAS_OP_N, CUBLAS_OP_N, hs, T_, T_, 1.0f, v, 3 * C, L.qkv, att, T_, L.square,
             0.0f, out, C, L.rows, B, NH);
}

template <class A>
void attention_backward(const OpContext& ctx, A* dqkv, const A* dout, const A* qkv, const A* att,
                        int B, int T_, int C, int NH) {
  const int hs = C / NH;
  const HeadLayout L(T_, C, NH);
  const A *q = qkv, *k = qkv + C, *v = qkv + 2 * C;
  A *dq = dqkv, *dk = dqkv + C, *dv = dqkv + 2 * C;
  const size_t square = size_t(B) * NH * T_ * T_;
  float* datt = scratch_as<float>(ctx, Scratch::F, square);
  A* dpre;  // the scores' gradient, a GEMM operand: in place where A is float
  if constexpr (std::is_same_v<A, float>)
    dpre = datt;
  else
    dpre = scratch_as<A>(ctx, Scratch::E, square);
  // datt[t, s] = sum_d dy[t, d] v[s, d]
  gemm_heads(ctx, CUBLAS_OP_T, CUBLAS_OP_N, T_, T_, hs, 1.0f, v, 3 * C, L.qkv, dout, C, L.rows,
             0.0f, datt, T_, L.square, B, NH);
  // dv[s, d] = sum_t att[t, s] dy[t, d]
  gemm_heads(ctx, CUBLAS_OP_N, CUBLAS_OP_T, hs, T_, T_, 1.0f, dout, C, L.rows, att, T_, L.square,
             0.0f, dv, 3 * C, L.qkv, B, NH);
  const int64_t rows = int64_t(B) * NH * T_;
  softmax_backward_kernel<<<blocks_for(rows, 8), 256, 0, stream_of(ctx)>>>(
      dpre, datt, att, T_, rows, 1.0f / sqrtf(float(hs)));
  DIVLAB_LAUNCHED(ctx, "softmax_backward");
  // dq[t, d] = sum_s dpre[t, s] k[s, d];  dk[s, d] = sum_t dpre[t, s] q[t, d]
  gemm_heads(ctx, CUBLAS_OP_N, CUBLAS_OP_N, hs, T_, T_, 1.0f, k, 3 * C, L.qkv, dpre, T_, L.square,
             0.0f, dq, 3 * C, L.qkv, B, NH);
  gemm_heads(ctx, CUBLAS_OP_N, CUBLAS_OP_T, hs, T_, T_, 1.0f, q, 3 * C, L.qkv, dpre, T_, L.square,
             0.0f, dk, 3 * C, L.qkv, B, NH);
}

// The fused cuDNN pair (kernels/attention/cudnn_sdpa.h): the bf16-mode reference wherever the
// engines take the shape. qkv, out, dout and dqkv are bf16 activations already, so the engines
// read and write them in place. The forward saves no probabilities (a fused forward never forms
// them): `att` is left alone, and the backward recomputes the forward's output and row
// statistics from qkv, as flash attention's backward recomputes P. The backward engine is the
// ordered-dQ one cuDNN declares deterministic (no float atomics), and is checked bit for bit
// run to run (kernels/cuda/test_cudnn_sdpa.cpp).
void fused_forward(const OpContext& ctx, bf16* out, const bf16* qkv, int B, int T_, int C, int NH) {
  float* stats = scratch_as<float>(ctx, Scratch::AttentionStats, size_t(B) * NH * T_);
  cudnn_sdpa_forward(ctx, as_nv(out), stats, as_nv(qkv), B, T_, C, NH);
}

void fused_backward(const OpContext& ctx, bf16* dqkv, const bf16* dout, const bf16* qkv, int B,
                    int T_, int C, int NH) {
  __nv_bfloat16* out =
      scratch_as<__nv_bfloat16>(ctx, Scratch::Attention16, size_t(B) * T_ * C);  // recomputed
  float* stats = scratch_as<float>(ctx, Scratch::AttentionStats, size_t(B) * NH * T_);
  cudnn_sdpa_forward(ctx, out, stats, as_nv(qkv), B, T_, C, NH);
  cudnn_sdpa_backward(ctx, as_nv(dqkv), as_nv(qkv), out, stats, as_nv(dout), B, T_, C, NH);
}

// Both halves decide from the shape alone, with the backward's (stricter) rule, so a forward
// that saved no probabilities is always followed by the backward that needs none.
bool fused(int T_, int C, int NH) {
  return cudnn_sdpa_unsupported(T_, C, NH, true).empty();
}

void bf16_reference_forward(const OpContext& ctx, bf16* out, bf16* att, const bf16* qkv, int B,
                            int T_, int C, int NH) {
  if (fused(T_, C, NH))
    fused_forward(ctx, out, qkv, B, T_, C, NH);
  else
    attention_forward<0, true>(ctx, out, att, qkv, B, T_, C, NH);
}

void bf16_reference_backward(const OpContext& ctx, bf16* dqkv, const bf16* dout, const bf16* qkv,
                             const bf16* att, int B, int T_, int C, int NH) {
  if (fused(T_, C, NH))
    fused_backward(ctx, dqkv, dout, qkv, B, T_, C, NH);
  else
    attention_backward(ctx, dqkv, dout, qkv, att, B, T_, C, NH);
}

// The reference pair with state passed between its halves (ReferencePairs::Attention): the model
// calls these where both references run unwrapped. The forward keeps its fp32 row statistics
// [B, NH, T] at the start of `att` ([B, NH, T, T] bf16, which the fused pair leaves alone: they
// fit where T >= 2) and notes in the caller's workspace where its output went: the model keeps
// each layer's attention output for the backward anyway (the projection's weight gradient reads
// it), so the backward reads both instead of recomputing them: the same engine on the same inputs,
// so the same bits (about a quarter of the backward's time at GPT-2 small). A backward whose
// forward was not noted recomputes, as the reference does.
bool saves_state(int T_, int C, int NH) {
  return fused(T_, C, NH) && T_ >= 2;
}
float* saved_stats(const bf16* att) {
  return reinterpret_cast<float*>(const_cast<bf16*>(att));
}

void saving_forward(const OpContext& ctx, bf16* out, bf16* att, const bf16* qkv, int B, int T_,
                    int C, int NH) {
  if (!saves_state(T_, C, NH)) return bf16_reference_forward(ctx, out, att, qkv, B, T_, C, NH);
  cudnn_sdpa_forward(ctx, as_nv(out), saved_stats(att), as_nv(qkv), B, T_, C, NH);
  device_workspace_of(ctx).note_attention_output(att, out);
}

void saved_backward(const OpContext& ctx, bf16* dqkv, const bf16* dout, const bf16* qkv,
                    const bf16* att, int B, int T_, int C, int NH) {
  const void* out =
      saves_state(T_, C, NH) ? device_workspace_of(ctx).attention_output(att) : nullptr;
  if (!out) return bf16_reference_backward(ctx, dqkv, dout, qkv, att, B, T_, C, NH);
  cudnn_sdpa_backward(ctx, as_nv(dqkv), as_nv(qkv), static_cast<const __nv_bfloat16*>(out),
                      saved_stats(att), as_nv(dout), B, T_, C, NH);
}
}  // namespace

// The batched-GEMM pair is the fp32 reference and, in bf16 mode, the named variant
// `batched_gemm`. The forward variants save probabilities, so they run with its backward.
template <class A>
void register_attention(Catalogue<float, A>& cat) {
  cat.attention_forward.what = "causal multi-head self-attention forward";
  cat.attention_backward.what = "causal multi-head self-attention backward";
  constexpr bool bf16_mode = std::is_same_v<A, bf16>;
  const std::string how = bf16_mode ? "bf16 tensor cores, fp32 scores" : "fp32";
  const std::string fwd = "batched cuBLAS GEMMs (" + how +
                          ") around a warp-per-row causal softmax; saves the probabilities";
  const std::string bwd = "batched cuBLAS GEMMs (" + how +
                          ") around a warp-per-row softmax backward, from the saved probabilities";
  if constexpr (bf16_mode) {
    cat.attention_forward.add(
        "reference", bf16_reference_forward,
        {"cuDNN fused SDPA (graph API; bf16 q, k, v, fp32 statistics and accumulation), saving no "
         "probabilities; batched GEMMs where the engines do not take the shape (head size not a "
         "multiple of 8 or above 128; on cuDNN before 9.16 also seq_len not a multiple of 128)",
         "", "", ""});
    cat.attention_backward.add(
        "reference", bf16_reference_backward,
        {"cuDNN fused SDPA backward (graph API, the ordered-dQ engine cuDNN declares "
         "deterministic), recomputing the forward's output and statistics from qkv (in training, "
         "read from the forward's saved state instead: the same bits); batched GEMMs where the "
         "forward used them",
         "", "", ""});
    cat.pairs.attention = {bf16_reference_forward, saving_forward, bf16_reference_backward,
                           saved_backward};
  } else {
    cat.attention_forward.add("reference", attention_forward<0, true, A>, {fwd, "", "", ""});
    cat.attention_backward.add("reference", attention_backward<A>, {bwd, "", "", ""});
  }
  VariantDoc batched_fwd{fwd, "", "", ""}, batched_bwd{bwd, "", "", ""};
  batched_fwd.benign = batched_bwd.benign = true;
  cat.attention_forward.add("batched_gemm", attention_forward<0, true, A>, batched_fwd);
  cat.attention_backward.add("batched_gemm", attention_backward<A>, batched_bwd);
  cat.attention_forward.add("mask_off_by_one", attention_forward<1, true, A>,
                            {"causal mask off by one: position i attends to 0..i+1", "", "", ""});
  cat.attention_forward.add("no_max_subtraction", attention_forward<0, false, A>,
                            {"softmax without subtracting the row max", "", "", ""});
  for (const char* v : {"batched_gemm", "mask_off_by_one", "no_max_subtraction"})
    cat.attention_forward.pair(v, "attention_backward", "batched_gemm");
  // ... and that backward needs a forward that saved them (bf16's fused reference saves none).
  cat.attention_backward.pair("batched_gemm", "attention_forward", "batched_gemm");
}

template void register_attention(Catalogue<float>&);
template void register_attention(Catalogue<float, bf16>&);

}  // namespace divlab::cuda
