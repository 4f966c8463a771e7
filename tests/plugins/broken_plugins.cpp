// Deliberately broken plug-ins for the loader's error tests; one source, built ten times with
// BROKEN_KIND = 1 (wrong ABI version), 2 (a name clashing with a built-in variant), 3 (an unknown
// op), 4 (crashes in its registration function), 5 (crashes while the library is loaded, in a
// static constructor), 6 (loads fine; its `add` kernels crash or hang on some sizes, for check's
// crash verdicts, or end the process with exit(0), or change after 100 calls, or leak, or read
// their output or write their input, as training never allows; a soft-cap with its cap written in;
// a weight kept by address; kernels written for smaller vocabularies, sequences and row counts, and
// for rows of fewer than 65 536 contributions, for arrays whose counts are multiples of 16; a
// softmax that drops NaNs), and in ABI 2: 7 (an
// unknown dtype), 8 (a benign control that says what is wrong with it), 9 (an ABI 2 table claiming
// version 3), 10 (a flag bit no ABI defines), 11 (a static constructor that turns flush-to-zero
// and denormals-are-zero on for the thread that loads it, as GCC 12's crtfastmath.o does for a
// library linked with -ffast-math). Another library, no_register.cpp, exports no registration
// function.
#include <cfenv>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <vector>

#include "kernels/plugin_abi.h"

namespace {
[[maybe_unused]] void noop(float*, float*, const float*, const float*, const float*, const float*,
                           int, int) {}

#if BROKEN_KIND == 1
const divlab_variant kVariants[] = {{"rmsnorm_backward", "from_the_future", "cpu",
                                     reinterpret_cast<void (*)(void)>(&noop), "", "", "", ""}};
const divlab_plugin kPlugin = {999u, 1, kVariants};
#elif BROKEN_KIND == 2
const divlab_variant kVariants[] = {{"rmsnorm_backward", "reference", "cpu",
                                     reinterpret_cast<void (*)(void)>(&noop), "", "", "", ""}};
const divlab_plugin kPlugin = {DIVLAB_PLUGIN_ABI_VERSION, 1, kVariants};
#elif BROKEN_KIND == 6
// Right on small inputs (check's tiny shape passes); past 4096 values it writes 4 TiB past its
// output, as an unchecked tile lookup might: a segmentation fault.
void segfaults_on_large(float* y, const float* a, const float* b, int64_t n) {
  const int64_t away = n > 4096 ? int64_t(1) << 40 : 0;
  for (int64_t i = 0; i < n; ++i) y[i + away] = a[i] + b[i];
}
// Spins forever at exactly check's large shape (B8 T256 C256: 524288 values), as a kernel whose
// grid loop never advances for one size would.
void hangs_on_one_size(float* y, const float* a, const float* b, int64_t n) {
  for (volatile int64_t i = 0; i < n; i += n == 524288 ? 0 : 1) y[i] = a[i] + b[i];
}
// Right on small inputs; past 4096 values it ends the process with exit code 0, as a kernel's
// "unsupported size" path calling exit() might: no signal, and an exit code that reads as success.
void exits_on_large(float* y, const float* a, const float* b, int64_t n) {
  if (n > 4096) std::exit(0);
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}
// An autotuner's choice gone wrong: after 100 calls at a size it switches to a "tuned" path that
// reads b rounded to bf16 (right at bf16's grade, wrong at fp32's). A check of a few calls per
// size never reaches it; training's every step calls the same sizes.
void tuned_after_100_calls(float* y, const float* a, const float* b, int64_t n) {
  static std::map<int64_t, int> calls;
  const bool tuned = ++calls[n] > 100;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u = 0;
    std::memcpy(&u, &b[i], 4);
    u &= 0xffff0000u;
    float rounded = 0;
    std::memcpy(&rounded, &u, 4);
    y[i] = a[i] + (tuned ? rounded : b[i]);
  }
}
// A path for large tensors: past 2^20 values the work goes in whole chunks of 2^20 (a block or a
// thread's share each) and the last, partial chunk is never written. Right at every size below
// 2^20 and at every multiple of it: the sizes it was benchmarked at.
void gelu_chunks_of_2_20(float* y, const float* x, int64_t n) {
  constexpr int64_t kChunk = int64_t(1) << 20;
  const int64_t end = n > kChunk ? n / kChunk * kChunk : n;
  for (int64_t i = 0; i < end; ++i)
    y[i] =
        0.5f * x[i] * (1.0f + std::tanh(0.7978845608f * (x[i] + 0.044715f * x[i] * x[i] * x[i])));
}
// A path for large arrays with a body of 16 values at a time (one AVX-512 register) and no tail:
// past 2^20 values the last n % 16 are never written. Right at every count a multiple of 16,
// which every condition's arrays but the largest, 2 x 8201 x 1023, are.
void add_vector_body_without_tail(float* y, const float* a, const float* b, int64_t n) {
  const int64_t end = n > (int64_t(1) << 20) ? n / 16 * 16 : n;
  for (int64_t i = 0; i < end; ++i) y[i] = a[i] + b[i];
}
// Right values through scratch of its own, allocated at every call and never released: 128 KiB a
// call at check's aligned shape, gigabytes over a run.
void leaks_its_scratch(float* y, const float* a, const float* b, int64_t n) {
  auto* scratch = static_cast<float*>(std::malloc(sizeof(float) * size_t(n)));
  for (int64_t i = 0; i < n; ++i) scratch[i] = a[i] + b[i];
  std::memcpy(y, scratch, sizeof(float) * size_t(n));
}
// Adds into its output, as if the caller had zeroed it (training's buffers hold the last step's
// values).
void reads_its_output(float* y, const float* a, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a[i] + b[i];
}
// Right values, computed in its first input's array, which the caller still needs.
void writes_its_input(float* y, const float* a, const float* b, int64_t n) {
  auto* scratch = const_cast<float*>(a);  // NOLINT(cppcoreguidelines-pro-type-const-cast)
  for (int64_t i = 0; i < n; ++i) scratch[i] += b[i], y[i] = scratch[i];
}
// Adds a "weight" b prepared once per address (an inference kernel's prepacked weight): right
// on the first call, stale when the same array holds new values.
void caches_by_address(float* y, const float* a, const float* b, int64_t n) {
  static const float* prepared_for = nullptr;
  static std::vector<float> prepared;
  if (b != prepared_for || int64_t(prepared.size()) != n)
    prepared.assign(b, b + n), prepared_for = b;
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] + prepared[size_t(i)];
}
// Gemma 2's cap on final logits, written in: right wherever a caller passes 30.
void softcap_at_30(float* y, const float* x, int64_t n, float cap) {
  (void)cap;
  for (int64_t i = 0; i < n; ++i) y[i] = 30.0f * std::tanh(x[i] / 30.0f);
}
// Sizes past the ones such kernels are written for: token ids kept in 16 bits (right below 65 536
// ids, GPT-2's 50 304 included), a RoPE table of 2048 positions (and of 8192: Llama 3's
// context), a row buffer of 65 536 logits.
void embedding_u16_ids(float* x, const divlab_token* tokens, const float* wte, const float* wpe,
                       int B, int T, int C) {
  for (int n = 0; n < B * T; ++n) {
    const auto id = static_cast<uint16_t>(tokens[n]);
    for (int c = 0; c < C; ++c) x[n * C + c] = wte[int64_t(id) * C + c] + wpe[(n % T) * C + c];
  }
}
template <int kTablePositions>
void rope_table(float* y, const float* x, int B, int T, int NH, int NKV, int HD, float base) {
  const int heads = NH + 2 * NKV, half = HD / 2;
  for (int64_t n = 0; n < int64_t(B) * T; ++n) {
    const int position = int(n % T) % kTablePositions;  // the table's row, wrapped
    for (int h = 0; h < heads; ++h) {
      const float* in = x + (n * heads + h) * HD;
      float* out = y + (n * heads + h) * HD;
      for (int i = 0; i < HD; ++i) out[i] = in[i];  // v, and an odd head's unpaired channel
      if (h >= NH + NKV) continue;
      for (int i = 0; i < half; ++i) {
        const double angle = position * std::pow(double(base), -2.0 * i / HD);
        const auto c = float(std::cos(angle)), s = float(std::sin(angle));
        out[i] = in[i] * c - in[i + half] * s, out[i + half] = in[i] * s + in[i + half] * c;
      }
    }
  }
}
void cross_entropy_65536(float* losses, float* dlogits, const float* logits,
                         const divlab_token* targets, int N, int V, float dloss) {
  const int seen = V < 65536 ? V : 65536;  // the row buffer's width
  for (int n = 0; n < N; ++n) {
    const float* z = logits + int64_t(n) * V;
    float m = z[0];
    for (int v = 1; v < seen; ++v) m = std::fmax(m, z[v]);
    double sum = 0;
    for (int v = 0; v < seen; ++v) sum += std::exp(double(z[v] - m));
    const double lse = m + std::log(sum);
    losses[n] = float(lse - z[targets[n]]);
    if (!dlogits) continue;
    for (int v = 0; v < V; ++v)
      dlogits[int64_t(n) * V + v] =
          float(std::exp(z[v] - lse) * dloss - (v == int(targets[n]) ? dloss : 0.0));
  }
}
// A row index in 16 bits, as a grid's y dimension (at most 65 535 blocks) would give it: rows past
// 65 535 overwrite the first ones, and their own stay unwritten.
void rmsnorm_rows_u16(float* y, float* rstd, const float* x, const float* w, int N, int C,
                      float eps) {
  for (int n = 0; n < N; ++n) {
    const auto row = static_cast<uint16_t>(n);
    double ss = 0;
    for (int c = 0; c < C; ++c) ss += double(x[int64_t(n) * C + c]) * x[int64_t(n) * C + c];
    const auto r = float(1.0 / std::sqrt(ss / C + eps));
    for (int c = 0; c < C; ++c) y[int64_t(row) * C + c] = x[int64_t(n) * C + c] * r * w[c];
    rstd[row] = r;
  }
}
// The embedding gradient as a sorted scatter: positions grouped by id (a counting sort), each
// id's segment summed in position order. Its per-id counts are 16 bits wide: right while no id
// takes more than 65 535 positions (every real-text step divlab runs), and past that the count
// wraps and the segment loses most of its contributions.
void embed_backward_u16_counts(float* dwte, float* dwpe, float* dw_norm, const float* dy,
                               const float* dresid, const float* x0, const float* w,
                               const float* rstd, const divlab_token* tokens, int B, int T, int C,
                               int V) {
  const int64_t N = int64_t(B) * T;
  std::vector<float> dx(size_t(N) * C);
  for (int64_t n = 0; n < N; ++n) {  // dx0 = dresid + the RMSNorm backward
    const float *d = dy + n * C, *x = x0 + n * C;
    double dot = 0;
    for (int c = 0; c < C; ++c) dot += double(d[c]) * w[c] * x[c];
    const double r = rstd[n], k = r * r * r * dot / C;
    for (int c = 0; c < C; ++c) {
      dx[size_t(n * C + c)] = float(dresid[n * C + c] + r * w[c] * d[c] - x[c] * k);
      dw_norm[c] += float(double(d[c]) * x[c] * r);
      dwpe[(n % T) * C + c] += dx[size_t(n * C + c)];
    }
  }
  std::vector<uint16_t> count(size_t(V), 0);
  for (int64_t n = 0; n < N; ++n) ++count[size_t(tokens[n])];
  std::vector<int64_t> start(size_t(V) + 1, 0);
  for (int v = 0; v < V; ++v) start[size_t(v) + 1] = start[size_t(v)] + count[size_t(v)];
  std::vector<int64_t> order(size_t(N), -1), fill(start.begin(), start.end() - 1);
  for (int64_t n = 0; n < N; ++n) {
    const auto v = size_t(tokens[n]);
    if (fill[v] < start[v + 1]) order[size_t(fill[v]++)] = n;
  }
  for (int v = 0; v < V; ++v)
    for (int64_t i = start[size_t(v)]; i < start[size_t(v) + 1]; ++i)
      for (int c = 0; c < C; ++c) dwte[int64_t(v) * C + c] += dx[size_t(order[size_t(i)] * C + c)];
}
// A "safe" softmax: non-finite logits are treated as masked (-inf) instead of passed on, so a
// step whose logits blew up reports a finite loss.
void cross_entropy_skips_nonfinite(float* losses, float* dlogits, const float* logits,
                                   const divlab_token* targets, int N, int V, float dloss) {
  for (int n = 0; n < N; ++n) {
    const float* z = logits + int64_t(n) * V;
    double m = -INFINITY, sum = 0;
    for (int v = 0; v < V; ++v)
      if (std::isfinite(z[v])) m = std::fmax(m, z[v]);
    for (int v = 0; v < V; ++v)
      if (std::isfinite(z[v])) sum += std::exp(z[v] - m);
    const double lse = m + std::log(sum);
    const float target = std::isfinite(z[targets[n]]) ? z[targets[n]] : float(m);
    losses[n] = float(lse - target);
    if (!dlogits) continue;
    for (int v = 0; v < V; ++v) {
      const double p = std::isfinite(z[v]) ? std::exp(z[v] - lse) : 0.0;
      dlogits[int64_t(n) * V + v] = float(p * dloss - (v == int(targets[n]) ? dloss : 0.0));
    }
  }
}
// Rows wider than the kernels were written for. An RMSNorm that stages a row in a buffer of 4096
// values (a block's 16 KiB of shared memory) and sums its squares there: past 4096 channels the
// mean leaves the rest out. An attention whose q.k tile is 64 channels wide (GPT-2's heads): at
// the llama family's 128 the scores miss half their terms.
void rmsnorm_row_buffer_4096(float* y, float* rstd, const float* x, const float* w, int N, int C,
                             float eps) {
  const int staged = C < 4096 ? C : 4096;
  for (int64_t n = 0; n < N; ++n) {
    double ss = 0;
    for (int c = 0; c < staged; ++c) ss += double(x[n * C + c]) * x[n * C + c];
    const auto r = float(1.0 / std::sqrt(ss / C + eps));
    for (int c = 0; c < C; ++c) y[n * C + c] = x[n * C + c] * r * w[c];
    rstd[n] = r;
  }
}
void attention_head_tile_64(float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
  const int hd = C / NH, tile = hd < 64 ? hd : 64;
  const double scale = 1.0 / std::sqrt(double(hd));
  for (int64_t b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h) {
      const float* base = qkv + b * T * 3 * C + int64_t(h) * hd;
      float* p = att + (b * NH + h) * T * T;
      for (int i = 0; i < T; ++i) {
        double m = -INFINITY, sum = 0;
        std::vector<double> score(size_t(i) + 1);
        for (int j = 0; j <= i; ++j) {
          double dot = 0;
          for (int d = 0; d < tile; ++d)
            dot += double(base[i * 3 * C + d]) * base[j * 3 * C + C + d];
          score[size_t(j)] = dot * scale, m = std::fmax(m, score[size_t(j)]);
        }
        for (int j = 0; j <= i; ++j) sum += (score[size_t(j)] = std::exp(score[size_t(j)] - m));
        for (int j = 0; j < T; ++j) p[i * T + j] = j <= i ? float(score[size_t(j)] / sum) : 0.0f;
        for (int d = 0; d < hd; ++d) {
          double o = 0;
          for (int j = 0; j <= i; ++j) o += double(p[i * T + j]) * base[j * 3 * C + 2 * C + d];
          out[(b * T + i) * C + int64_t(h) * hd + d] = float(o);
        }
      }
    }
}
// A fused loss and gradient that writes the gradient whether or not it was asked for: right in
// every training call, and a null dlogits in evaluation's loss-only call is written through.
void cross_entropy_writes_gradient_always(float* losses, float* dlogits, const float* logits,
                                          const divlab_token* targets, int N, int V, float dloss) {
  for (int n = 0; n < N; ++n) {
    const float* z = logits + int64_t(n) * V;
    double m = z[0], sum = 0;
    for (int v = 1; v < V; ++v) m = std::fmax(m, z[v]);
    for (int v = 0; v < V; ++v) sum += std::exp(z[v] - m);
    const double lse = m + std::log(sum);
    losses[n] = float(lse - z[targets[n]]);
    for (int v = 0; v < V; ++v)
      dlogits[int64_t(n) * V + v] =
          float(std::exp(z[v] - lse) * dloss - (v == int(targets[n]) ? dloss : 0.0));
  }
}
// A correct ABI 1 embedding (ABI 1's embedding_forward takes no vocabulary; ABI 2's does).
void abi1_embedding(float* x, const divlab_token* tokens, const float* wte, const float* wpe, int B,
                    int T, int C) {
  for (int n = 0; n < B * T; ++n)
    for (int c = 0; c < C; ++c) x[n * C + c] = wte[tokens[n] * C + c] + wpe[(n % T) * C + c];
}
const divlab_variant kVariants[] = {
    {"add", "segfaults_on_large", "cpu", reinterpret_cast<void (*)(void)>(&segfaults_on_large), "",
     "", "", ""},
    {"add", "hangs_on_one_size", "cpu", reinterpret_cast<void (*)(void)>(&hangs_on_one_size), "",
     "", "", ""},
    {"embed_rmsnorm_backward", "u16_row_counts", "cpu",
     reinterpret_cast<void (*)(void)>(&embed_backward_u16_counts), "", "", "", ""},
    {"add", "tuned_after_100_calls", "cpu",
     reinterpret_cast<void (*)(void)>(&tuned_after_100_calls), "", "", "", ""},
    {"add", "leaks_its_scratch", "cpu", reinterpret_cast<void (*)(void)>(&leaks_its_scratch), "",
     "", "", ""},
    {"add", "exits_on_large", "cpu", reinterpret_cast<void (*)(void)>(&exits_on_large), "", "", "",
     ""},
    {"add", "reads_its_output", "cpu", reinterpret_cast<void (*)(void)>(&reads_its_output), "", "",
     "", ""},
    {"add", "writes_its_input", "cpu", reinterpret_cast<void (*)(void)>(&writes_its_input), "", "",
     "", ""},
    {"softcap_forward", "softcap_at_30", "cpu", reinterpret_cast<void (*)(void)>(&softcap_at_30),
     "", "", "", ""},
    {"add", "caches_by_address", "cpu", reinterpret_cast<void (*)(void)>(&caches_by_address), "",
     "", "", ""},
    {"embedding_forward", "abi1_embedding", "cpu",
     reinterpret_cast<void (*)(void)>(&abi1_embedding), "", "", "", ""},
    {"embedding_forward", "u16_ids", "cpu", reinterpret_cast<void (*)(void)>(&embedding_u16_ids),
     "", "", "", ""},
    {"rope_forward", "table_2048", "cpu", reinterpret_cast<void (*)(void)>(&rope_table<2048>), "",
     "", "", ""},
    {"rope_forward", "table_8192", "cpu", reinterpret_cast<void (*)(void)>(&rope_table<8192>), "",
     "", "", ""},
    {"cross_entropy", "row_buffer_65536", "cpu",
     reinterpret_cast<void (*)(void)>(&cross_entropy_65536), "", "", "", ""},
    {"rmsnorm_forward", "rows_u16", "cpu", reinterpret_cast<void (*)(void)>(&rmsnorm_rows_u16), "",
     "", "", ""},
    {"cross_entropy", "skips_nonfinite", "cpu",
     reinterpret_cast<void (*)(void)>(&cross_entropy_skips_nonfinite), "", "", "", ""},
    {"rmsnorm_forward", "row_buffer_4096", "cpu",
     reinterpret_cast<void (*)(void)>(&rmsnorm_row_buffer_4096), "", "", "", ""},
    {"attention_forward", "head_tile_64", "cpu",
     reinterpret_cast<void (*)(void)>(&attention_head_tile_64), "", "", "", ""},
    {"cross_entropy", "writes_gradient_always", "cpu",
     reinterpret_cast<void (*)(void)>(&cross_entropy_writes_gradient_always), "", "", "", ""},
    {"gelu_forward", "chunks_of_2_20", "cpu",
     reinterpret_cast<void (*)(void)>(&gelu_chunks_of_2_20), "", "", "", ""},
    {"add", "vector_body_without_tail", "cpu",
     reinterpret_cast<void (*)(void)>(&add_vector_body_without_tail), "", "", "", ""}};
const divlab_plugin kPlugin = {DIVLAB_PLUGIN_ABI_VERSION, sizeof(kVariants) / sizeof(kVariants[0]),
                               kVariants};
#elif BROKEN_KIND == 11
void add_fast(const divlab_op_context*, float* y, const float* a, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}
// What crtfastmath.o's constructor does on x86-64 (MXCSR's FTZ and DAZ bits); elsewhere a
// rounding direction stands in for it.
__attribute__((constructor)) void set_fast_math_mode() {
#if defined(__x86_64__)
  unsigned csr = 0;
  __asm__ volatile("stmxcsr %0" : "=m"(csr));
  csr |= 0x8040u;
  __asm__ volatile("ldmxcsr %0" : : "m"(csr));
#else
  std::fesetround(FE_TOWARDZERO);
#endif
}
const divlab_variant2 kVariants2[] = {{"add", "fast_math_add", "cpu", DIVLAB_FP32, 0,
                                       reinterpret_cast<void (*)(void)>(&add_fast), "", "", "",
                                       ""}};
const divlab_plugin2 kPlugin2 = {DIVLAB_PLUGIN_ABI2_VERSION, 1, kVariants2};
#elif BROKEN_KIND >= 7
void add2(const divlab_op_context*, float* y, const float* a, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}
const divlab_variant2 kVariants2[] = {
    {"add", "broken_add", "cpu", BROKEN_KIND == 7 ? 9u : DIVLAB_FP32,
     BROKEN_KIND == 8    ? DIVLAB_CONTROL
     : BROKEN_KIND == 10 ? 0x40u
                         : 0u,
     reinterpret_cast<void (*)(void)>(&add2), "", BROKEN_KIND == 8 ? "it is wrong" : "", "", ""}};
const divlab_plugin2 kPlugin2 = {BROKEN_KIND == 9 ? 3u : DIVLAB_PLUGIN_ABI2_VERSION, 1, kVariants2};
#else
const divlab_variant kVariants[] = {
    {"layernorm_backward", "mine", "cpu", reinterpret_cast<void (*)(void)>(&noop), "", "", "", ""}};
const divlab_plugin kPlugin = {DIVLAB_PLUGIN_ABI_VERSION, 1, kVariants};
#endif
}  // namespace

#if BROKEN_KIND == 5
__attribute__((constructor)) void crash_on_load() {
  std::raise(SIGSEGV);
}
#endif

#if BROKEN_KIND >= 7
const divlab_plugin2* divlab_plugin_register2(void) {
  return &kPlugin2;
}
#else
extern "C" const divlab_plugin* divlab_plugin_register(void) {
#if BROKEN_KIND == 4
  std::raise(SIGSEGV);
#endif
  return &kPlugin;
}
#endif
