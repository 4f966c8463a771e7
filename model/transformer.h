// A decoder-only transformer of one of two families, over B x T tokens, mean cross-entropy:
//   gpt2:  token + learned position embeddings; n blocks of pre-RMSNorm causal multi-head
//          attention and a GELU MLP (width 4C); a final RMSNorm; an untied LM head.
//   llama: token embeddings only; n blocks of pre-RMSNorm attention with RoPE on q and k and
//          grouped-query key/value heads, and a SwiGLU MLP; every residual add fused with the
//          RMSNorm after it (add_rmsnorm_forward); the final RMSNorm.
// Either may tie the LM head to the token embedding and soft-cap the final logits (Gemma 2).
// Forward and backward side by side; every op goes through a KernelSet, so these files never
// know which backend or which variant runs (gpt2's blocks in transformer.cpp, llama's in
// llama.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "common/named_enum.h"
#include "kernels/common/lowp.h"
#include "kernels/registry.h"

namespace divlab {

enum class Arch { Gpt2, Llama };
template <>
struct EnumNames<Arch> {
  static constexpr std::pair<Arch, const char*> table[] = {{Arch::Gpt2, "gpt2"},
                                                           {Arch::Llama, "llama"}};
};

struct ModelConfig {
  Arch arch = Arch::Gpt2;
  int vocab = 256;
  int d_model = 64;
  int n_layers = 2;
  int n_heads = 4;
  int n_kv_heads = 0;  // llama: key/value heads (0: n_heads, multi-head attention)
  int seq_len = 32;
  int mlp_hidden = 0;        // the MLP's width F (0: 4C for gpt2; llama: 8C / 3 rounded up to 64)
  double rope_base = 10000;  // llama: RoPE's frequency base
  bool tied_embeddings = false;  // the LM head is the token embedding (one tensor, wte)
  double logit_softcap = 0;      // final logits -> cap tanh(logits / cap) (0: off)
  double norm_eps = 1e-5;
  double init_std = 0.02;

  bool llama() const { return arch == Arch::Llama; }
  int kv_heads() const { return n_kv_heads > 0 ? n_kv_heads : n_heads; }
  int head_dim() const { return d_model / n_heads; }
  int hidden() const;
  // The width of the attention projection's output: 3C, or (NH + 2 NKV) HD with fewer kv heads.
  int64_t qkv_width() const { return int64_t(n_heads + 2 * kv_heads()) * head_dim(); }
  // The MLP's first projection: F (gpt2) or gate | up, 2F (llama).
  int64_t mlp_in_width() const { return llama() ? 2 * int64_t(hidden()) : hidden(); }
};

// Whether a model of this config calls `op` in its forward or backward. The optimizer's ops and
// the bf16 cast depend on the run, not the model, and count as called. A kernel or shadow choice
// for an op the model never calls would label a run with a kernel that never ran.
bool model_calls(const ModelConfig& cfg, Op op);

// One named parameter tensor inside the flat parameter buffer.
struct ParamInfo {
  std::string name;  // PyTorch-style: "blocks.0.attn.qkv.weight"
  std::vector<int64_t> shape;
  int64_t offset = 0;
  int64_t size = 0;
  bool is_norm = false;  // RMSNorm gains: initialised to 1, no weight decay
};

std::vector<ParamInfo> param_layout(const ModelConfig& cfg);
int64_t param_count(const ModelConfig& cfg);

// T stores the parameters, gradients and the residual stream; A the activations between ops
// (kernels/ops.h). With A != T the forward first casts the weights to A (as mixed-precision
// training does), and the backward casts the residual gradient where a GEMM reads it.
template <class T, class A = T>
class Transformer {
 public:
  Transformer(const ModelConfig& cfg, const KernelSet<T, A>& kernels, int batch);
  ~Transformer();
  Transformer(const Transformer&) = delete;
  Transformer& operator=(const Transformer&) = delete;

  // How many bytes the constructor allocates (parameters, gradients, activations, scratch):
  // lets a device backend refuse a model that will not fit before allocating any of it.
  static int64_t allocated_bytes(const ModelConfig& cfg, int batch);

  // Normal(0, init_std) weights; residual output projections scaled by 1/sqrt(2 n_layers) (GPT-2);
  // RMSNorm gains 1. Deterministic in `seed`.
  void init(uint64_t seed);

  // Mean cross-entropy over B x T positions. With `for_backward`, also keeps what backward needs
  // (the logits' gradient comes out of the fused cross-entropy kernel here).
  T forward(const TokenId* inputs, const TokenId* targets, bool for_backward);
  // The same in two halves, so that a step's backward is queued before its loss is waited for:
  // start_forward() queues the forward (the tokens go up and the per-position losses come down
  // through staging memory, without waiting for the device) and loss() waits for them and
  // returns their mean. Every start_forward() must be followed by loss() before the next one:
  // the staging memory is reused.
  void start_forward(const TokenId* inputs, const TokenId* targets, bool for_backward);
  T loss();
  // Zeroes the gradients, then fills them for the last forward(for_backward = true).
  void backward();
  // A training step's forward and backward: start_forward(inputs, targets, true), then
  // backward(); loss() as after start_forward. With graph steps on, the same work replayed from a
  // CUDA graph (the same kernels on the same buffers, so the same bits). With `accumulate` the
  // gradients are not zeroed first: this batch's are added into them (a micro-batch after the
  // step's first).
  void start_step(const TokenId* inputs, const TokenId* targets, bool accumulate = false);
  // The model's batch as one of `m` micro-batches of a step (train.micro_batches): the loss's
  // gradient is scaled to the mean over all m batches' tokens, so that m start_step calls, every
  // one after the first accumulating, leave the gradient of the step's whole batch. Every op
  // that writes a gradient adds into it (kernels/ops.h), so a kernel that accumulates in its
  // own precision goes on accumulating over the micro-batches: they do not divide its dose.
  void set_micro_batches(int m);
  int micro_batches() const { return micro_batches_; }
  // Graph steps for start_step, where the backend's memory has graphs (CUDA; ignored on the host):
  // the first step runs op by op (its calls grow the scratch and build cuDNN's plans), the next is
  // captured, and every step after replays it, one launch instead of hundreds. A graph replays
  // the kernels and op contexts it captured, seeds included, and none of the host code around
  // them (wrappers, taps, `after_op`): the caller turns it on only for kernels that draw no random
  // bits, on a stream of its own (set_stream; the legacy stream cannot be captured). A step with
  // `after_op` set runs op by op; changing the kernels, the stream or the debugging drops the
  // graph. A step that cannot be captured runs op by op, and graph steps turn off
  // (graph_failure() says why).
  void set_graph_steps(bool on);
  int64_t graph_replays() const { return graph_replays_; }
  const std::string& graph_failure() const { return graph_failure_; }

  const ModelConfig& config() const { return cfg_; }
  int batch() const { return B_; }
  const std::vector<ParamInfo>& layout() const { return layout_; }
  // Flat parameter and gradient buffers, in the backend's memory (layout() gives the offsets).
  // Whoever takes the parameters to change them may have: the weights' copy in A is cast again.
  Buffer<T>& params() {
    weights_current_ = false;
    return params_;
  }
  const Buffer<T>& params() const { return params_; }
  // The optimizer's update as the pair with the weights' cast (ReferencePairs::SgdCast): the
  // copy in A it writes beside the parameters (null where A is T: no copy), and the mark that it
  // did, for the whole buffer, after params() was taken.
  A* weight_copy();
  void weights_cast_by_update() { weights_current_ = !std::is_same_v<T, A>; }
  const Buffer<T>& grads() const { return grads_; }
  Buffer<T>& grads() { return grads_; }  // the trainer reduces data-parallel shards into it
  // The logits of the last forward, [B*T, V] row-major (read by `divlab sample`).
  const Buffer<A>& logits() const { return logits_; }
  const KernelSet<T, A>& kernels() const { return k_; }
  void set_kernels(const KernelSet<T, A>& k) {
    k_ = k;
    drop_graph();
  }
  // The seed of the op calls from here on: each call gets its own seed derived from it and the
  // call's index (kernels/op_context.h). The trainer sets one per step from the run's seed and
  // the step, so a resumed run's kernels draw the same random bits as an uninterrupted one.
  void reseed(uint64_t seed) { contexts_.reseed(seed); }
  // The context of one more op call in this model's sequence (the optimizer's calls are the
  // model's: same stream, same workspace, seeds continuing the step's).
  OpContext next_op_context() { return contexts_.next(); }
  // The stream the ops and the model's own copies run on (a cudaStream_t; null: the legacy
  // default stream).
  void set_stream(void* stream) {
    drop_graph();
    contexts_.set_stream(stream);
  }
  void* stream() const { return contexts_.stream(); }
  // Debugging: device launchers wait for each kernel and name the one that failed (slow).
  void set_sync_each_launch(bool on) {
    contexts_.set_sync_each_launch(on);
    drop_graph();
  }

  // What one op call wrote, for NaN/Inf attribution: `after_op`, when set, sees every op's
  // outputs in execution order (layer -1: outside the blocks). Unset in normal training.
  // `data` is in the backend's memory (kernels().memory says whether the host may read it).
  struct OpOutput {
    const char* pass;  // "forward" | "backward"
    const char* op;    // kernel op name
    int layer;
    const char* tensor;  // what was written, e.g. "attn.qkv" or "grad mlp.fc.weight"
    const void* data;
    Storage type;  // T's or A's
    int64_t size;
  };
  std::function<void(const OpOutput&)> after_op;

 private:
  template <class V>
  void observe(const char* pass, const char* op, int layer, const char* tensor, const V* data,
               int64_t size) const {
    if (after_op) after_op({pass, op, layer, tensor, data, storage_of<V>(), size});
  }
  // The weights as linear layers read them: the parameters themselves where A = T, else their
  // copy in A (refreshed by cast_weights() at the start of every forward, unless the
  // optimizer's update wrote it already).
  const A* linear_weights() const;
  void cast_weights();
  // start_forward's halves: the tokens into staging memory; the forward's work queued (weights
  // cast, tokens up, the ops, losses down); the fence behind it.
  void stage_tokens(const TokenId* inputs, const TokenId* targets);
  void queue_forward(bool for_backward);
  void fence_loss();
  // backward() after the gradients' zeroing: the residual gradient zeroed, the blocks' backward.
  void queue_backward();
  // The graph of one start_step's work (the gradients' zeroing left out: a micro-batch that
  // accumulates replays the same graph), or null where it could not be captured.
  void* capture_step();
  void drop_graph();
  // The attention kernels of this forward and the backward after it: the set's reference pair
  // passing state in `att` where the last forward(for_backward) ran it (ReferencePairs), else
  // the set's own.
  const Kernel<typename OpSignatures<T, A>::AttentionForward>& attention_forward() const;
  const Kernel<typename OpSignatures<T, A>::AttentionBackward>& attention_backward() const;
  // Where an op's output is observed (OpOutput's layer and tensor).
  struct Named {
    int layer;
    const char* tensor;
  };
  // sum = x + tmp_, then normed = RMSNorm(sum) with `gain`: the set's reference pair where it
  // runs one (ReferencePairs::AddNorm), else the two ops.
  void add_then_norm(T* sum, A* normed, T* rstd, const T* x, const T* gain, Named sum_name,
                     Named norm_name);
  // dres_ += the RMSNorm backward of dln_; with the reference pair of the norm's backward and the
  // cast (bf16 mode), dres_act_ is written too, for the GEMM that reads it next.
  void norm_backward(T* dgain, const T* x, const T* gain, const T* rstd, Named name);
  // dres_ where a GEMM reads it as its dy: itself where A = T, else cast into dres_act_.
  const A* residual_grad_for_gemm();

  struct Layer {  // offsets of one block's tensors in the flat buffers
    int64_t ln1, qkv, proj, ln2, fc, fc2;
  };
  struct LayerActs {
    Buffer<A> ln1, qkv, att, atty, ln2, h, g;
    Buffer<A> qkv_raw, qkv_rot;  // llama: the projection's output, then rotated (qkv: expanded)
    Buffer<T> rstd1, xmid, rstd2;
  };
  // llama's attention input: the rotated projection, expanded where kv heads are shared.
  const A* attention_input(const LayerActs& a) const;
  void forward_gpt2(bool for_backward);
  void forward_llama(bool for_backward);
  void backward_gpt2();
  void backward_llama();
  // Shared by both families: the logits from lnf_out_ (soft-capped if configured) and the loss;
  // and their backward, into dln_ and the head's (or the tied embedding's) gradient.
  void head_forward(const A* W, bool for_backward);
  void head_backward(const A* W, T* G);

  ModelConfig cfg_;
  KernelSet<T, A> k_;
  OpContextSource contexts_;  // this model's op contexts: its stream, workspace and seeds
  int B_, N_;
  int micro_batches_ = 1;
  std::vector<ParamInfo> layout_;
  std::vector<Layer> layers_;
  int64_t wte_, wpe_, lnf_, head_;  // wpe_: -1 for llama; head_ = wte_ when tied
  Buffer<T> params_, grads_;
  Buffer<A> weights_;  // the parameters in A, where A != T

  // Activations of the last forward.
  Buffer<TokenId> tokens_, targets_;
  std::vector<Buffer<T>> resid_;  // resid_[l]: input of block l; resid_[L]: final stream
  std::vector<LayerActs> acts_;
  Buffer<A> lnf_out_, logits_, dlogits_;
  Buffer<A> logits_raw_, dlogits_raw_;             // before the soft-cap (only with one)
  Buffer<T> zero_positions_, position_grad_sink_;  // llama: no position table (zeros; discarded)
  Buffer<T> rstdf_, losses_;
  // The host side of the forward's copies (StagingBuffer), and the fence behind the losses'
  // download (null: no loss pending).
  StagingBuffer<TokenId> staged_tokens_, staged_targets_;
  StagingBuffer<T> staged_losses_;
  void* loss_fence_ = nullptr;
  bool loss_pending_ = false;
  bool attention_saved_ = false;   // the last forward ran attention as its reference pair
  bool dres_act_current_ = false;  // dres_act_ holds dres_ cast already (norm_backward)
  bool weights_current_ = false;   // weights_ holds params_ cast already (the optimizer's pair)
  // Graph steps (start_step): on, a step taken op by op since, the captured graph, replays.
  bool graph_steps_ = false, graph_warm_ = false;
  void* graph_ = nullptr;
  uint64_t graph_moves_ = 0;       // the workspace's moves() when the graph was captured
  bool graph_skips_cast_ = false;  // captured while weights_ was current: no cast in the graph
  int64_t graph_replays_ = 0;
  std::string graph_failure_;
  // Gradient scratch, reused every step.
  Buffer<T> dres_;
  Buffer<A> dres_act_, dln_, dqkv_, datty_, dh_, dg_, tmp_;
  Buffer<A> dqkv_rot_, dqkv_raw_;  // llama: the gradient through the kv expansion and RoPE
};

}  // namespace divlab
