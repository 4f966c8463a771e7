#include "model/transformer.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <type_traits>

#include "common/rng.h"

namespace divlab {

int ModelConfig::hidden() const {
  if (mlp_hidden > 0) return mlp_hidden;
  // llama's rule: int(2/3 of 4C), rounded up to a multiple (Meta's multiple_of, 256 there; 64
  // keeps small models small), so the MLP's GEMMs get tensor-core-friendly widths (at C 512 an
  // unaligned 1365 made the model's linear ops take 1.9x their time on an H100).
  return llama() ? (int(8.0 * d_model / 3.0) + 63) / 64 * 64 : 4 * d_model;
}

bool model_calls(const ModelConfig& cfg, Op op) {
  const bool llama = cfg.llama(), gqa = llama && cfg.kv_heads() != cfg.n_heads;
  switch (op) {
    case Op::gelu_forward:
    case Op::gelu_backward:
    case Op::add:
      return !llama;
    case Op::rope_forward:
    case Op::rope_backward:
    case Op::swiglu_forward:
    case Op::swiglu_backward:
    case Op::add_rmsnorm_forward:
      return llama;
    case Op::gqa_forward:
    case Op::gqa_backward:
      return gqa;
    case Op::softcap_forward:
    case Op::softcap_backward:
      return cfg.logit_softcap > 0;
    case Op::embedding_forward:
    case Op::rmsnorm_forward:
    case Op::rmsnorm_backward:
    case Op::linear_forward:
    case Op::linear_backward:
    case Op::attention_forward:
    case Op::attention_backward:
    case Op::cross_entropy:
    case Op::embed_rmsnorm_backward:
    case Op::cast:
    case Op::sum_squares:
    case Op::sgd_step:
    case Op::adamw_step:
      return true;
    case Op::grad_reduce:  // the trainer's, between the shards of a data-parallel step
      return false;
    case Op::count:
      break;
  }
  throw std::logic_error("model_calls: Op::count is not an op");
}

std::vector<ParamInfo> param_layout(const ModelConfig& cfg) {
  const int64_t V = cfg.vocab, C = cfg.d_model, T = cfg.seq_len, F = cfg.hidden();
  std::vector<ParamInfo> out;
  int64_t offset = 0;
  auto add = [&](std::string name, std::vector<int64_t> shape, bool is_norm = false) {
    int64_t size = 1;
    for (auto d : shape) size *= d;
    out.push_back({std::move(name), std::move(shape), offset, size, is_norm});
    offset += size;
  };
  add("wte.weight", {V, C});
  if (!cfg.llama()) add("wpe.weight", {T, C});
  for (int l = 0; l < cfg.n_layers; ++l) {
    const std::string p = "blocks." + std::to_string(l) + ".";
    add(p + "ln1.weight", {C}, true);
    add(p + "attn.qkv.weight", {cfg.qkv_width(), C});
    add(p + "attn.proj.weight", {C, C});
    add(p + "ln2.weight", {C}, true);
    add(p + "mlp.fc.weight", {cfg.mlp_in_width(), C});  // llama: gate rows, then up rows
    add(p + "mlp.proj.weight", {C, F});
  }
  add("ln_f.weight", {C}, true);
  if (!cfg.tied_embeddings) add("lm_head.weight", {V, C});
  return out;
}

int64_t param_count(const ModelConfig& cfg) {
  const auto layout = param_layout(cfg);
  return layout.back().offset + layout.back().size;
}

template <class T, class A>
Transformer<T, A>::Transformer(const ModelConfig& cfg, const KernelSet<T, A>& kernels, int batch)
    : cfg_(cfg),
      k_(kernels),
      contexts_(*kernels.memory),
      B_(batch),
      N_(batch * cfg.seq_len),
      layout_(param_layout(cfg)) {
  if (cfg.d_model % cfg.n_heads != 0)
    throw std::invalid_argument("d_model must be divisible by n_heads");
  if (cfg.n_heads % cfg.kv_heads() != 0)
    throw std::invalid_argument("n_kv_heads must divide n_heads");
  auto offset_of = [&](const std::string& name) {
    for (const auto& p : layout_)
      if (p.name == name) return p.offset;
    throw std::logic_error("no parameter " + name);
  };
  wte_ = offset_of("wte.weight");
  wpe_ = cfg.llama() ? -1 : offset_of("wpe.weight");
  lnf_ = offset_of("ln_f.weight");
  head_ = cfg.tied_embeddings ? wte_ : offset_of("lm_head.weight");
  for (int l = 0; l < cfg.n_layers; ++l) {
    const std::string p = "blocks." + std::to_string(l) + ".";
    layers_.push_back({offset_of(p + "ln1.weight"), offset_of(p + "attn.qkv.weight"),
                       offset_of(p + "attn.proj.weight"), offset_of(p + "ln2.weight"),
                       offset_of(p + "mlp.fc.weight"), offset_of(p + "mlp.proj.weight")});
  }
  const int64_t n = param_count(cfg), N = N_, C = cfg.d_model, V = cfg.vocab, S = cfg.seq_len;
  const int64_t F = cfg.hidden(), Fin = cfg.mlp_in_width(), W = cfg.qkv_width();
  const bool gqa = cfg.llama() && cfg.kv_heads() != cfg.n_heads;
  const MemoryOps& mem = *kernels.memory;
  auto buf = [&](int64_t size) { return Buffer<T>(mem, size); };
  auto act = [&](int64_t size) { return Buffer<A>(mem, size); };
  constexpr bool kSplit = !std::is_same_v<T, A>;
  params_ = buf(n), grads_ = buf(n);
  if (kSplit) weights_ = act(n);
  tokens_ = Buffer<TokenId>(mem, N), targets_ = Buffer<TokenId>(mem, N);
  for (int l = 0; l <= cfg.n_layers; ++l) resid_.push_back(buf(N * C));
  acts_.resize(cfg.n_layers);
  for (auto& a : acts_) {
    a.ln1 = act(N * C), a.rstd1 = buf(N);
    if (cfg.llama()) a.qkv_raw = act(N * W), a.qkv_rot = act(N * W);
    if (!cfg.llama() || gqa) a.qkv = act(N * 3 * C);
    a.att = act(int64_t(B_) * cfg.n_heads * S * S), a.atty = act(N * C), a.xmid = buf(N * C);
    a.ln2 = act(N * C), a.rstd2 = buf(N), a.h = act(N * Fin), a.g = act(N * F);
  }
  lnf_out_ = act(N * C), rstdf_ = buf(N), logits_ = act(N * V), dlogits_ = act(N * V);
  if (cfg.logit_softcap > 0) logits_raw_ = act(N * V), dlogits_raw_ = act(N * V);
  if (cfg.llama()) {
    zero_positions_ = buf(S * C), position_grad_sink_ = buf(S * C);
    zero_positions_.zero(stream());
  }
  losses_ = buf(N);
  staged_tokens_ = StagingBuffer<TokenId>(mem, N), staged_targets_ = StagingBuffer<TokenId>(mem, N);
  staged_losses_ = StagingBuffer<T>(mem, N);
  dres_ = buf(N * C), dln_ = act(N * C), dqkv_ = act(N * 3 * C), datty_ = act(N * C);
  if (cfg.llama()) dqkv_raw_ = act(N * W);
  if (gqa) dqkv_rot_ = act(N * W);
  if (kSplit) dres_act_ = act(N * C);
  dh_ = act(N * Fin), dg_ = act(N * F), tmp_ = act(N * C);
}

template <class T, class A>
int64_t Transformer<T, A>::allocated_bytes(const ModelConfig& cfg, int batch) {
  const int64_t N = int64_t(batch) * cfg.seq_len, C = cfg.d_model, V = cfg.vocab, S = cfg.seq_len;
  const int64_t n = param_count(cfg), split = std::is_same_v<T, A> ? 0 : 1;
  const int64_t F = cfg.hidden(), Fin = cfg.mlp_in_width(), W = cfg.qkv_width();
  const int64_t llama = cfg.llama(), gqa = cfg.llama() && cfg.kv_heads() != cfg.n_heads;
  const int64_t capped = cfg.logit_softcap > 0;
  const int64_t t = sizeof(T), a = sizeof(A);
  const int64_t att = int64_t(batch) * cfg.n_heads * S * S;
  const int64_t qkv = (1 - llama + gqa) * 3 * N * C + llama * 2 * N * W;
  const int64_t layer_t = N * C + 2 * N;
  const int64_t layer_a = 3 * N * C + qkv + att + N * Fin + N * F;
  const int64_t stream_t = 2 * n + (cfg.n_layers + 1) * N * C + 2 * N + N * C + llama * 2 * S * C;
  const int64_t stream_a = split * n + N * C + (2 + 2 * capped) * N * V + N * C * (3 + split) +
                           N * Fin + N * F + N * 3 * C + llama * N * W + gqa * N * W;
  return t * (stream_t + cfg.n_layers * layer_t) + a * (stream_a + cfg.n_layers * layer_a) +
         int64_t(sizeof(TokenId)) * 2 * N;
}

template <class T, class A>
const A* Transformer<T, A>::linear_weights() const {
  if constexpr (std::is_same_v<T, A>)
    return params_.data();
  else
    return weights_.data();
}

template <class T, class A>
void Transformer<T, A>::cast_weights() {
  if constexpr (!std::is_same_v<T, A>) {
    const OpContext ctx = contexts_.next();
    // Written already by the optimizer's update as the pair with this cast, and nothing took
    // the parameters since: the cast's call is still counted, so later calls draw the seeds
    // they draw op by op.
    if (!weights_current_) k_.cast(ctx, weights_.data(), params_.data(), params_.size());
  }
}

template <class T, class A>
A* Transformer<T, A>::weight_copy() {
  if constexpr (std::is_same_v<T, A>)
    return nullptr;
  else
    return weights_.data();
}

template <class T, class A>
const A* Transformer<T, A>::residual_grad_for_gemm() {
  if constexpr (std::is_same_v<T, A>) {
    return dres_.data();
  } else {
    const OpContext ctx = contexts_.next();
    // Written already by the norm's backward as the pair with the cast (norm_backward): the
    // cast's call is still counted, so later calls draw the seeds they draw op by op.
    if (dres_act_current_)
      dres_act_current_ = false;
    else
      k_.cast(ctx, dres_act_.data(), dres_.data(), dres_.size());
    return dres_act_.data();
  }
}

template <class T, class A>
const Kernel<typename OpSignatures<T, A>::AttentionForward>& Transformer<T, A>::attention_forward()
    const {
  return attention_saved_ ? k_.pairs->attention.saving_forward : k_.attention_forward;
}

template <class T, class A>
const Kernel<typename OpSignatures<T, A>::AttentionBackward>&
Transformer<T, A>::attention_backward() const {
  return attention_saved_ && k_.attention_pair() ? k_.pairs->attention.saved_backward
                                                 : k_.attention_backward;
}

template <class T, class A>
void Transformer<T, A>::init(uint64_t seed) {
  Rng rng(seed, kStreamInit);
  const double proj_std = cfg_.init_std / std::sqrt(2.0 * cfg_.n_layers);
  std::vector<T> host(params_.size());
  for (const auto& p : layout_) {
    const bool residual_out = p.name.find(".proj.weight") != std::string::npos;
    const double std = residual_out ? proj_std : cfg_.init_std;
    for (int64_t i = 0; i < p.size; ++i)
      host[p.offset + i] = p.is_norm ? T(1) : T(rng.normal() * std);
  }
  params_.upload(host.data(), params_.size(), 0, stream());
  weights_current_ = false;
}

template <class T, class A>
void Transformer<T, A>::forward_gpt2(bool for_backward) {
  const int C = cfg_.d_model, Tn = cfg_.seq_len, NH = cfg_.n_heads, N = N_;
  const int F = cfg_.hidden();
  const T eps = T(cfg_.norm_eps);
  const T* P = params_.data();
  const A* W = linear_weights();
  k_.embedding_forward(contexts_.next(), resid_[0].data(), tokens_.data(), P + wte_, P + wpe_, B_,
                       Tn, C, cfg_.vocab);
  observe("forward", "embedding_forward", -1, "x0", resid_[0].data(), int64_t(N) * C);
  // Block 0's ln1 alone; every later norm follows the residual add before it (add_then_norm).
  k_.rmsnorm_forward(contexts_.next(), acts_[0].ln1.data(), acts_[0].rstd1.data(), resid_[0].data(),
                     P + layers_[0].ln1, N, C, eps);
  observe("forward", "rmsnorm_forward", 0, "ln1", acts_[0].ln1.data(), int64_t(N) * C);
  for (int l = 0; l < cfg_.n_layers; ++l) {
    const Layer& w = layers_[l];
    LayerActs& a = acts_[l];
    const T* x = resid_[l].data();
    k_.linear_forward(contexts_.next(), a.qkv.data(), a.ln1.data(), W + w.qkv, N, C, 3 * C);
    observe("forward", "linear_forward", l, "attn.qkv", a.qkv.data(), int64_t(N) * 3 * C);
    attention_forward()(contexts_.next(), a.atty.data(), a.att.data(), a.qkv.data(), B_, Tn, C, NH);
    observe("forward", "attention_forward", l, "attn.out", a.atty.data(), int64_t(N) * C);
    k_.linear_forward(contexts_.next(), tmp_.data(), a.atty.data(), W + w.proj, N, C, C);
    observe("forward", "linear_forward", l, "attn.proj", tmp_.data(), int64_t(N) * C);
    add_then_norm(a.xmid.data(), a.ln2.data(), a.rstd2.data(), x, P + w.ln2, {l, "resid.mid"},
                  {l, "ln2"});
    k_.linear_forward(contexts_.next(), a.h.data(), a.ln2.data(), W + w.fc, N, C, F);
    observe("forward", "linear_forward", l, "mlp.fc", a.h.data(), int64_t(N) * F);
    k_.gelu_forward(contexts_.next(), a.g.data(), a.h.data(), int64_t(N) * F);
    observe("forward", "gelu_forward", l, "mlp.gelu", a.g.data(), int64_t(N) * F);
    k_.linear_forward(contexts_.next(), tmp_.data(), a.g.data(), W + w.fc2, N, F, C);
    observe("forward", "linear_forward", l, "mlp.proj", tmp_.data(), int64_t(N) * C);
    // The block's output stream and the next norm: the next block's ln1, or the final ln_f.
    const bool last = l + 1 == cfg_.n_layers;
    add_then_norm(resid_[l + 1].data(), last ? lnf_out_.data() : acts_[l + 1].ln1.data(),
                  last ? rstdf_.data() : acts_[l + 1].rstd1.data(), a.xmid.data(),
                  P + (last ? lnf_ : layers_[l + 1].ln1), {l, "resid.out"},
                  {last ? -1 : l + 1, last ? "ln_f" : "ln1"});
  }
  head_forward(W, for_backward);
}

template <class T, class A>
void Transformer<T, A>::add_then_norm(T* sum, A* normed, T* rstd, const T* x, const T* gain,
                                      Named sum_name, Named norm_name) {
  const int N = N_, C = cfg_.d_model;
  const int64_t NC = int64_t(N) * C;
  const T eps = T(cfg_.norm_eps);
  if (k_.add_norm_pair()) {
    const OpContext ctx = contexts_.next();
    contexts_.next();  // the norm's call: later calls draw the seeds they draw op by op
    k_.pairs->add_norm.fused(ctx, sum, normed, rstd, x, tmp_.data(), gain, B_, cfg_.seq_len, C,
                             eps);
  } else {
    k_.add(contexts_.next(), sum, x, tmp_.data(), NC);
    observe("forward", "add", sum_name.layer, sum_name.tensor, sum, NC);
    k_.rmsnorm_forward(contexts_.next(), normed, rstd, sum, gain, N, C, eps);
    observe("forward", "rmsnorm_forward", norm_name.layer, norm_name.tensor, normed, NC);
    return;
  }
  observe("forward", "add", sum_name.layer, sum_name.tensor, sum, NC);
  observe("forward", "rmsnorm_forward", norm_name.layer, norm_name.tensor, normed, NC);
}

template <class T, class A>
void Transformer<T, A>::norm_backward(T* dgain, const T* x, const T* gain, const T* rstd,
                                      Named name) {
  const int N = N_, C = cfg_.d_model;
  if constexpr (!std::is_same_v<T, A>) {
    if (k_.norm_backward_cast_pair()) {
      k_.pairs->norm_backward_cast.fused(contexts_.next(), dres_.data(), dgain, dln_.data(), x,
                                         gain, rstd, N, C, dres_act_.data());
      dres_act_current_ = true;
      observe("backward", "rmsnorm_backward", name.layer, name.tensor, dres_.data(),
              int64_t(N) * C);
      return;
    }
  }
  k_.rmsnorm_backward(contexts_.next(), dres_.data(), dgain, dln_.data(), x, gain, rstd, N, C);
  observe("backward", "rmsnorm_backward", name.layer, name.tensor, dres_.data(), int64_t(N) * C);
}

template <class T, class A>
void Transformer<T, A>::head_forward(const A* W, bool for_backward) {
  const int C = cfg_.d_model, V = cfg_.vocab, N = N_;
  const int64_t NV = int64_t(N) * V;
  const bool capped = cfg_.logit_softcap > 0;
  A* head_out = capped ? logits_raw_.data() : logits_.data();
  k_.linear_forward(contexts_.next(), head_out, lnf_out_.data(), W + head_, N, C, V);
  observe("forward", "linear_forward", -1, "lm_head (logits)", head_out, NV);
  if (capped) {
    k_.softcap_forward(contexts_.next(), logits_.data(), logits_raw_.data(), NV,
                       T(cfg_.logit_softcap));
    observe("forward", "softcap_forward", -1, "logits (soft-capped)", logits_.data(), NV);
  }
  k_.cross_entropy(contexts_.next(), losses_.data(), for_backward ? dlogits_.data() : nullptr,
                   logits_.data(), targets_.data(), N, V, T(1) / T(int64_t(N) * micro_batches_));
  observe("forward", "cross_entropy", -1, "losses", losses_.data(), N);
  if (for_backward) observe("forward", "cross_entropy", -1, "dlogits", dlogits_.data(), NV);
}

template <class T, class A>
void Transformer<T, A>::head_backward(const A* W, T* G) {
  const int C = cfg_.d_model, V = cfg_.vocab, N = N_;
  const A* dhead = dlogits_.data();
  if (cfg_.logit_softcap > 0) {
    k_.softcap_backward(contexts_.next(), dlogits_raw_.data(), dlogits_.data(), logits_raw_.data(),
                        int64_t(N) * V, T(cfg_.logit_softcap));
    observe("backward", "softcap_backward", -1, "grad logits (before the cap)", dlogits_raw_.data(),
            int64_t(N) * V);
    dhead = dlogits_raw_.data();
  }
  // Tied: the head's gradient lands in the token embedding's, which the scatter adds to later.
  k_.linear_backward(contexts_.next(), dln_.data(), G + head_, dhead, lnf_out_.data(), W + head_, N,
                     C, V);
  observe("backward", "linear_backward", -1,
          cfg_.tied_embeddings ? "grad wte.weight (tied head)" : "grad lm_head.weight", G + head_,
          int64_t(V) * C);
  observe("backward", "linear_backward", -1, "grad ln_f", dln_.data(), int64_t(N) * C);
}

template <class T, class A>
void Transformer<T, A>::backward_gpt2() {
  const int C = cfg_.d_model, V = cfg_.vocab, Tn = cfg_.seq_len, NH = cfg_.n_heads, N = N_;
  const int F = cfg_.hidden();
  const T* P = params_.data();
  const A* W = linear_weights();
  T* G = grads_.data();
  head_backward(W, G);
  norm_backward(G + lnf_, resid_.back().data(), P + lnf_, rstdf_.data(),
                {-1, "grad resid (final)"});
  for (int l = cfg_.n_layers - 1; l >= 0; --l) {
    const Layer& w = layers_[l];
    LayerActs& a = acts_[l];
    // dres holds d loss / d resid_[l + 1] = d / d(xmid + mlp(ln2(xmid))).
    k_.linear_backward(contexts_.next(), dg_.data(), G + w.fc2, residual_grad_for_gemm(),
                       a.g.data(), W + w.fc2, N, F, C);
    observe("backward", "linear_backward", l, "grad mlp.proj.weight", G + w.fc2, int64_t(F) * C);
    observe("backward", "linear_backward", l, "grad mlp.gelu", dg_.data(), int64_t(N) * F);
    k_.gelu_backward(contexts_.next(), dh_.data(), dg_.data(), a.h.data(), int64_t(N) * F);
    observe("backward", "gelu_backward", l, "grad mlp.fc", dh_.data(), int64_t(N) * F);
    k_.linear_backward(contexts_.next(), dln_.data(), G + w.fc, dh_.data(), a.ln2.data(), W + w.fc,
                       N, C, F);
    observe("backward", "linear_backward", l, "grad mlp.fc.weight", G + w.fc, int64_t(F) * C);
    observe("backward", "linear_backward", l, "grad ln2", dln_.data(), int64_t(N) * C);
    norm_backward(G + w.ln2, a.xmid.data(), P + w.ln2, a.rstd2.data(), {l, "grad resid.mid"});
    // dres now holds d loss / d xmid = d / d(resid_[l] + attn(ln1(resid_[l]))).
    k_.linear_backward(contexts_.next(), datty_.data(), G + w.proj, residual_grad_for_gemm(),
                       a.atty.data(), W + w.proj, N, C, C);
    observe("backward", "linear_backward", l, "grad attn.proj.weight", G + w.proj, int64_t(C) * C);
    observe("backward", "linear_backward", l, "grad attn.out", datty_.data(), int64_t(N) * C);
    attention_backward()(contexts_.next(), dqkv_.data(), datty_.data(), a.qkv.data(), a.att.data(),
                         B_, Tn, C, NH);
    observe("backward", "attention_backward", l, "grad attn.qkv", dqkv_.data(), int64_t(N) * 3 * C);
    k_.linear_backward(contexts_.next(), dln_.data(), G + w.qkv, dqkv_.data(), a.ln1.data(),
                       W + w.qkv, N, C, 3 * C);
    observe("backward", "linear_backward", l, "grad attn.qkv.weight", G + w.qkv,
            int64_t(3) * C * C);
    observe("backward", "linear_backward", l, "grad ln1", dln_.data(), int64_t(N) * C);
    if (l > 0) {
      norm_backward(G + w.ln1, resid_[l].data(), P + w.ln1, a.rstd1.data(), {l, "grad resid.in"});
    } else {
      // The bottom of the network: one fused kernel, the one candidates replace.
      k_.embed_rmsnorm_backward(contexts_.next(), G + wte_, G + wpe_, G + w.ln1, dln_.data(),
                                dres_.data(), resid_[0].data(), P + w.ln1, a.rstd1.data(),
                                tokens_.data(), B_, Tn, C, V);
      observe("backward", "embed_rmsnorm_backward", 0, "grad wte.weight", G + wte_, int64_t(V) * C);
      observe("backward", "embed_rmsnorm_backward", 0, "grad wpe.weight", G + wpe_,
              int64_t(Tn) * C);
    }
  }
}

template class Transformer<float>;
template class Transformer<double>;
template class Transformer<float, bf16>;
}  // namespace divlab
