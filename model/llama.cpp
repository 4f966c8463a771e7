// The llama family's blocks (model/transformer.h): RoPE, grouped-query attention, SwiGLU, and
// every residual add fused with the RMSNorm after it. The embedding and its backward are gpt2's
// ops with an all-zero position table (RoPE carries the positions), whose gradient is discarded.
#include <type_traits>

#include "model/transformer.h"

namespace divlab {

template <class T, class A>
const A* Transformer<T, A>::attention_input(const LayerActs& a) const {
  return cfg_.kv_heads() != cfg_.n_heads ? a.qkv.data() : a.qkv_rot.data();
}

template <class T, class A>
void Transformer<T, A>::forward_llama(bool for_backward) {
  const int C = cfg_.d_model, Tn = cfg_.seq_len, NH = cfg_.n_heads, NKV = cfg_.kv_heads(), N = N_;
  const int HD = cfg_.head_dim(), F = cfg_.hidden(), Wq = int(cfg_.qkv_width());
  const int64_t NC = int64_t(N) * C;
  const T eps = T(cfg_.norm_eps), base = T(cfg_.rope_base);
  const T* P = params_.data();
  const A* W = linear_weights();
  k_.embedding_forward(contexts_.next(), resid_[0].data(), tokens_.data(), P + wte_,
                       zero_positions_.data(), B_, Tn, C, cfg_.vocab);
  observe("forward", "embedding_forward", -1, "x0", resid_[0].data(), NC);
  // Block 0's norm alone; every later norm is fused with the add before it.
  k_.rmsnorm_forward(contexts_.next(), acts_[0].ln1.data(), acts_[0].rstd1.data(), resid_[0].data(),
                     P + layers_[0].ln1, N, C, eps);
  observe("forward", "rmsnorm_forward", 0, "ln1", acts_[0].ln1.data(), NC);
  for (int l = 0; l < cfg_.n_layers; ++l) {
    const Layer& w = layers_[l];
    LayerActs& a = acts_[l];
    k_.linear_forward(contexts_.next(), a.qkv_raw.data(), a.ln1.data(), W + w.qkv, N, C, Wq);
    observe("forward", "linear_forward", l, "attn.qkv", a.qkv_raw.data(), int64_t(N) * Wq);
    k_.rope_forward(contexts_.next(), a.qkv_rot.data(), a.qkv_raw.data(), B_, Tn, NH, NKV, HD,
                    base);
    observe("forward", "rope_forward", l, "attn.qkv (rotated)", a.qkv_rot.data(), int64_t(N) * Wq);
    if (NKV != NH) {
      k_.gqa_forward(contexts_.next(), a.qkv.data(), a.qkv_rot.data(), N, NH, NKV, HD);
      observe("forward", "gqa_forward", l, "attn.qkv (kv heads shared)", a.qkv.data(), 3 * NC);
    }
    attention_forward()(contexts_.next(), a.atty.data(), a.att.data(), attention_input(a), B_, Tn,
                        C, NH);
    observe("forward", "attention_forward", l, "attn.out", a.atty.data(), NC);
    k_.linear_forward(contexts_.next(), tmp_.data(), a.atty.data(), W + w.proj, N, C, C);
    observe("forward", "linear_forward", l, "attn.proj", tmp_.data(), NC);
    k_.add_rmsnorm_forward(contexts_.next(), a.xmid.data(), a.ln2.data(), a.rstd2.data(),
                           resid_[l].data(), tmp_.data(), P + w.ln2, B_, Tn, C, eps);
    observe("forward", "add_rmsnorm_forward", l, "resid.mid", a.xmid.data(), NC);
    observe("forward", "add_rmsnorm_forward", l, "ln2", a.ln2.data(), NC);
    k_.linear_forward(contexts_.next(), a.h.data(), a.ln2.data(), W + w.fc, N, C, 2 * F);
    observe("forward", "linear_forward", l, "mlp.fc (gate | up)", a.h.data(), int64_t(N) * 2 * F);
    k_.swiglu_forward(contexts_.next(), a.g.data(), a.h.data(), N, F);
    observe("forward", "swiglu_forward", l, "mlp.swiglu", a.g.data(), int64_t(N) * F);
    k_.linear_forward(contexts_.next(), tmp_.data(), a.g.data(), W + w.fc2, N, F, C);
    observe("forward", "linear_forward", l, "mlp.proj", tmp_.data(), NC);
    // The block's output stream and the next norm: the next block's ln1, or the final ln_f.
    const bool last = l + 1 == cfg_.n_layers;
    A* next_norm = last ? lnf_out_.data() : acts_[l + 1].ln1.data();
    T* next_rstd = last ? rstdf_.data() : acts_[l + 1].rstd1.data();
    k_.add_rmsnorm_forward(contexts_.next(), resid_[l + 1].data(), next_norm, next_rstd,
                           a.xmid.data(), tmp_.data(), P + (last ? lnf_ : layers_[l + 1].ln1), B_,
                           Tn, C, eps);
    observe("forward", "add_rmsnorm_forward", l, "resid.out", resid_[l + 1].data(), NC);
    observe("forward", "add_rmsnorm_forward", l, last ? "ln_f" : "next ln1", next_norm, NC);
  }
  head_forward(W, for_backward);
}

template <class T, class A>
void Transformer<T, A>::backward_llama() {
  const int C = cfg_.d_model, V = cfg_.vocab, Tn = cfg_.seq_len, NH = cfg_.n_heads, N = N_;
  const int NKV = cfg_.kv_heads(), HD = cfg_.head_dim(), F = cfg_.hidden();
  const int Wq = int(cfg_.qkv_width());
  const int64_t NC = int64_t(N) * C;
  const T* P = params_.data();
  const A* W = linear_weights();
  T* G = grads_.data();
  const T base = T(cfg_.rope_base);
  position_grad_sink_.zero(stream());
  head_backward(W, G);
  norm_backward(G + lnf_, resid_.back().data(), P + lnf_, rstdf_.data(),
                {-1, "grad resid (final)"});
  for (int l = cfg_.n_layers - 1; l >= 0; --l) {
    const Layer& w = layers_[l];
    LayerActs& a = acts_[l];
    // dres holds d loss / d resid_[l + 1]; the fused add passes it to xmid unchanged.
    k_.linear_backward(contexts_.next(), dg_.data(), G + w.fc2, residual_grad_for_gemm(),
                       a.g.data(), W + w.fc2, N, F, C);
    observe("backward", "linear_backward", l, "grad mlp.proj.weight", G + w.fc2, int64_t(F) * C);
    observe("backward", "linear_backward", l, "grad mlp.swiglu", dg_.data(), int64_t(N) * F);
    k_.swiglu_backward(contexts_.next(), dh_.data(), dg_.data(), a.h.data(), N, F);
    observe("backward", "swiglu_backward", l, "grad mlp.fc (gate | up)", dh_.data(),
            int64_t(N) * 2 * F);
    k_.linear_backward(contexts_.next(), dln_.data(), G + w.fc, dh_.data(), a.ln2.data(), W + w.fc,
                       N, C, 2 * F);
    observe("backward", "linear_backward", l, "grad mlp.fc.weight", G + w.fc, int64_t(2) * F * C);
    observe("backward", "linear_backward", l, "grad ln2", dln_.data(), NC);
    norm_backward(G + w.ln2, a.xmid.data(), P + w.ln2, a.rstd2.data(), {l, "grad resid.mid"});
    k_.linear_backward(contexts_.next(), datty_.data(), G + w.proj, residual_grad_for_gemm(),
                       a.atty.data(), W + w.proj, N, C, C);
    observe("backward", "linear_backward", l, "grad attn.proj.weight", G + w.proj, int64_t(C) * C);
    observe("backward", "linear_backward", l, "grad attn.out", datty_.data(), NC);
    attention_backward()(contexts_.next(), dqkv_.data(), datty_.data(), attention_input(a),
                         a.att.data(), B_, Tn, C, NH);
    observe("backward", "attention_backward", l, "grad attn.qkv", dqkv_.data(), 3 * NC);
    const A* drot = dqkv_.data();
    if (NKV != NH) {
      k_.gqa_backward(contexts_.next(), dqkv_rot_.data(), dqkv_.data(), N, NH, NKV, HD);
      observe("backward", "gqa_backward", l, "grad attn.qkv (rotated)", dqkv_rot_.data(),
              int64_t(N) * Wq);
      drot = dqkv_rot_.data();
    }
    k_.rope_backward(contexts_.next(), dqkv_raw_.data(), drot, B_, Tn, NH, NKV, HD, base);
    observe("backward", "rope_backward", l, "grad attn.qkv (projection)", dqkv_raw_.data(),
            int64_t(N) * Wq);
    k_.linear_backward(contexts_.next(), dln_.data(), G + w.qkv, dqkv_raw_.data(), a.ln1.data(),
                       W + w.qkv, N, C, Wq);
    observe("backward", "linear_backward", l, "grad attn.qkv.weight", G + w.qkv, int64_t(Wq) * C);
    observe("backward", "linear_backward", l, "grad ln1", dln_.data(), NC);
    if (l > 0) {
      norm_backward(G + w.ln1, resid_[l].data(), P + w.ln1, a.rstd1.data(), {l, "grad resid.in"});
    } else {
      // The fused bottom op; with tied embeddings the scatter adds to the head's gradient.
      k_.embed_rmsnorm_backward(contexts_.next(), G + wte_, position_grad_sink_.data(), G + w.ln1,
                                dln_.data(), dres_.data(), resid_[0].data(), P + w.ln1,
                                a.rstd1.data(), tokens_.data(), B_, Tn, C, V);
      observe("backward", "embed_rmsnorm_backward", 0, "grad wte.weight", G + wte_, int64_t(V) * C);
    }
  }
}

template class Transformer<float>;
template class Transformer<double>;
template class Transformer<float, bf16>;
}  // namespace divlab
