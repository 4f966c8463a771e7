// Candidate variants of embed_rmsnorm_backward. All share the reference's first half (dx0, the
// RMSNorm weight gradient) and differ only in how dx0 is scattered into the embedding gradients,
// which is where the reported kernel went wrong.
#include <omp.h>

#include <atomic>
#include <vector>

#include "common/rng.h"
#include "kernels/common/lowp.h"
#include "kernels/common/parallel.h"
#include "kernels/embed_rmsnorm_backward/embed_rmsnorm_backward.h"

namespace divlab {
namespace {

// Scatters dx0 into dwte (by token) and dwpe (by position) with a custom accumulation: every
// addition is acc = round(acc + x, n, c), in position order, with the accumulator stored in the
// gradient buffer itself (every stored value is exactly representable after `round`).
template <class T, class Round>
void scatter_rounded(T* dwte, T* dwpe, const T* dx0, const TokenId* tokens, int B, int T_, int C,
                     Round round) {
  const int64_t N = int64_t(B) * T_;
  parallel_chunks(C, 16, [&](int64_t c0, int64_t c1) {
    for (int64_t n = 0; n < N; ++n) {
      T* row = dwte + int64_t(tokens[n]) * C;
      for (int64_t c = c0; c < c1; ++c)
        row[c] = T(round(float(row[c]) + float(dx0[n * C + c]), n, c));
    }
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < T_; ++t)
        for (int64_t c = c0; c < c1; ++c) {
          T& acc = dwpe[int64_t(t) * C + c];
          acc = T(round(float(acc) + float(dx0[(int64_t(b) * T_ + t) * C + c]), b, c));
        }
  });
}

#define DIVLAB_DX0                   \
  const int64_t N = int64_t(B) * T_; \
  const std::vector<T> dx0 =         \
      embed_rmsnorm_dx0(dw_norm, dy_norm, dresid, x0, w_norm, rstd, int(N), C)

template <class T>
void bf16_accum(T* dwte, T* dwpe, T* dw_norm, const T* dy_norm, const T* dresid, const T* x0,
                const T* w_norm, const T* rstd, const TokenId* tokens, int B, int T_, int C, int) {
  DIVLAB_DX0;
  scatter_rounded(dwte, dwpe, dx0.data(), tokens, B, T_, C,
                  [](float s, int64_t, int64_t) { return lowp::bf16_rne(s); });
}

template <class T>
void fp16_accum(T* dwte, T* dwpe, T* dw_norm, const T* dy_norm, const T* dresid, const T* x0,
                const T* w_norm, const T* rstd, const TokenId* tokens, int B, int T_, int C, int) {
  DIVLAB_DX0;
  scatter_rounded(dwte, dwpe, dx0.data(), tokens, B, T_, C,
                  [](float s, int64_t, int64_t) { return lowp::fp16_rne(s); });
}

template <class T>
void bf16_truncate_accum(T* dwte, T* dwpe, T* dw_norm, const T* dy_norm, const T* dresid,
                         const T* x0, const T* w_norm, const T* rstd, const TokenId* tokens, int B,
                         int T_, int C, int) {
  DIVLAB_DX0;
  scatter_rounded(dwte, dwpe, dx0.data(), tokens, B, T_, C,
                  [](float s, int64_t, int64_t) { return lowp::bf16_truncate(s); });
}

// Fresh random bits for every addition: hash of (the call's seed, position, channel). The seed
// comes with the call (OpContext::seed, fresh for every call and repeated on a resumed run's same
// call), so the bits are deterministic for any thread count and different on every call.
template <class T>
void bf16_stochastic_accum(const OpContext& ctx, T* dwte, T* dwpe, T* dw_norm, const T* dy_norm,
                           const T* dresid, const T* x0, const T* w_norm, const T* rstd,
                           const TokenId* tokens, int B, int T_, int C, int) {
  DIVLAB_DX0;
  scatter_rounded(dwte, dwpe, dx0.data(), tokens, B, T_, C, [&](float s, int64_t n, int64_t c) {
    return lowp::bf16_stochastic(s, uint32_t(mix64(ctx.seed ^ uint64_t(n * C + c))));
  });
}

// The same "random" bits for every addition to a channel, on every call: the generator was
// seeded once with a constant and never advanced. Each channel gets a fixed rounding threshold,
// so its rounding errors no longer cancel.
template <class T>
void bf16_stochastic_reused_seed(T* dwte, T* dwpe, T* dw_norm, const T* dy_norm, const T* dresid,
                                 const T* x0, const T* w_norm, const T* rstd, const TokenId* tokens,
                                 int B, int T_, int C, int) {
  DIVLAB_DX0;
  scatter_rounded(dwte, dwpe, dx0.data(), tokens, B, T_, C, [](float s, int64_t, int64_t c) {
    return lowp::bf16_stochastic(s, uint32_t(mix64(0x5eedULL + uint64_t(c))));
  });
}

// Non-atomic read-modify-write from several threads: positions are dealt round-robin to the
// threads, and each adds its row with a separate load and store. When two threads hit the same
// token row at once, one update is lost. (Relaxed atomic loads and stores: a real race with
// defined behaviour in C++, as on a GPU without atomicAdd.)
template <class T>
void racy_scatter(T* dwte, T* dwpe, T* dw_norm, const T* dy_norm, const T* dresid, const T* x0,
                  const T* w_norm, const T* rstd, const TokenId* tokens, int B, int T_, int C,
                  int) {
  DIVLAB_DX0;
#pragma omp parallel
  {
    const int nt = omp_get_num_threads(), id = omp_get_thread_num();
    for (int64_t n = id; n < N; n += nt) {
      T* row = dwte + int64_t(tokens[n]) * C;
      for (int64_t c = 0; c < C; ++c) {
        T old;
        __atomic_load(&row[c], &old, __ATOMIC_RELAXED);
        T updated = old + dx0[n * C + c];
        __atomic_store(&row[c], &updated, __ATOMIC_RELAXED);
      }
    }
  }
  position_grad(dwpe, dx0.data(), B, T_, C);
}

// Control: the same fp32 math, positions summed in reverse order.
template <class T>
void fp32_reordered(T* dwte, T* dwpe, T* dw_norm, const T* dy_norm, const T* dresid, const T* x0,
                    const T* w_norm, const T* rstd, const TokenId* tokens, int B, int T_, int C,
                    int) {
  DIVLAB_DX0;
  parallel_chunks(C, 16, [&](int64_t c0, int64_t c1) {
    for (int64_t n = N - 1; n >= 0; --n) {
      T* row = dwte + int64_t(tokens[n]) * C;
      for (int64_t c = c0; c < c1; ++c) row[c] += dx0[n * C + c];
    }
  });
  position_grad(dwpe, dx0.data(), B, T_, C);
}

// Control: every row summed in fp64 and rounded once.
template <class T>
void fp64_accum(T* dwte, T* dwpe, T* dw_norm, const T* dy_norm, const T* dresid, const T* x0,
                const T* w_norm, const T* rstd, const TokenId* tokens, int B, int T_, int C,
                int V) {
  DIVLAB_DX0;
  std::vector<double> acc(int64_t(V) * C, 0.0);
  parallel_chunks(C, 16, [&](int64_t c0, int64_t c1) {
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = c0; c < c1; ++c) acc[int64_t(tokens[n]) * C + c] += double(dx0[n * C + c]);
    for (int64_t v = 0; v < V; ++v)
      for (int64_t c = c0; c < c1; ++c)
        if (acc[v * C + c] != 0.0) dwte[v * C + c] = T(double(dwte[v * C + c]) + acc[v * C + c]);
  });
  position_grad(dwpe, dx0.data(), B, T_, C);
}

#undef DIVLAB_DX0
}  // namespace

template <class T>
void register_embed_rmsnorm_backward_variants(Catalogue<T>& cat) {
  auto& op = cat.embed_rmsnorm_backward;
  op.add("bf16_accum", bf16_accum<T>,
         {"THE REPORTED BUG: each embedding row accumulated in a bf16 accumulator, rounded to "
          "nearest even after every addition, in position order (token rows and position rows)",
          "a row with many same-sign contributions stalls: once |acc| > 2^8 |x|, x is rounded "
          "away; frequent tokens' rows lose their small contributions",
          "skewed token streams (Zipf, real text) with many tokens per step: the hottest row "
          "collects thousands of additions; SGD applies the shrunken gradient as is; tied "
          "embeddings (model.tied_embeddings), where the LM head's dense gradient is already in "
          "the buffer, so even a rare token's few contributions are added to a larger value",
          "uniform tokens (a few additions per row); AdamW (invariant to a row's gradient "
          "scale); verifiers with Gaussian inputs and 99 % of elements"});
  op.add("fp16_accum", fp16_accum<T>,
         {"each embedding row accumulated in an IEEE fp16 accumulator (round to nearest even)",
          "11 significant bits: stalls near 2048 same-sign contributions; overflows to inf "
          "above 65504, and underflows to zero below 6e-8 (subnormals below 6e-5)",
          "very skewed, very large batches; tiny gradients (early training, small loss scale)",
          "uniform tokens; moderate batch sizes; AdamW"});
  op.add("bf16_truncate_accum", bf16_truncate_accum<T>,
         {"bf16 accumulation that truncates (rounds toward zero) instead of rounding to nearest",
          "biased rounding: every addition shrinks the accumulator's magnitude by up to one "
          "ulp, so errors add up instead of cancelling, already at a few contributions",
          "any repeated ids, more so the hotter the row",
          "AdamW (scale invariance hides a uniformly shrunken row); fp32 comparisons with loose "
          "tolerances"});
  op.add("bf16_stochastic_accum", bf16_stochastic_accum<T>,
         {"bf16 accumulation with stochastic rounding, fresh random bits for every addition",
          "unbiased in expectation but noisy: variance grows with the number of additions",
          "hot rows (the noise adds up); bitwise comparisons (not deterministic across calls)",
          "averaging over steps; AdamW", false, /*graphable=*/false});
  op.add("bf16_stochastic_reused_seed", bf16_stochastic_reused_seed<T>,
         {"bf16 accumulation with 'stochastic' rounding whose generator is re-seeded with the "
          "same constant on every call and never advanced",
          "each channel rounds with one fixed threshold: the rounding is deterministic and "
          "biased, so it fails like truncation on hot rows while looking randomised",
          "hot rows; comparing the per-channel error sign across steps (it never changes)",
          "single-call verification, which cannot tell a reused seed from a fresh one"});
  op.add("racy_scatter", racy_scatter<T>,
         {"token rows updated with a plain load + store from every thread (no atomics)",
          "two threads adding to the same row at once lose one update",
          "repeated ids processed concurrently: skewed data, several threads",
          "one thread (exact); uniform tokens (collisions are rare)"});
  op.add("fp32_reordered", fp32_reordered<T>,
         {"CONTROL: reference math, positions summed in reverse order", "", "",
          "nothing to mask: differs from the reference only by fp32 rounding", true});
  op.add("fp64_accum", fp64_accum<T>,
         {"CONTROL: every row summed in fp64 and rounded once (more accurate than the "
          "reference)",
          "", "", "nothing to mask: differs from the reference only by fp32 rounding", true});
}

template void register_embed_rmsnorm_backward_variants(Catalogue<float>&);
template void register_embed_rmsnorm_backward_variants(Catalogue<double>&);
}  // namespace divlab
