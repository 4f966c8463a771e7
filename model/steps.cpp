// How the model's work is queued on its backend: the tokens up and the losses down through
// staging memory, the loss read after the backward is queued, and graph steps (start_step: a
// training step's forward and backward replayed from a CUDA graph). The blocks themselves are
// transformer.cpp's and llama.cpp's.
#include <algorithm>
#include <stdexcept>

#include "model/transformer.h"

namespace divlab {

template <class T, class A>
Transformer<T, A>::~Transformer() {
  drop_graph();
  try {
    if (loss_fence_) k_.memory->wait_fence(loss_fence_);  // copies into the staging memory
  } catch (...) {  // the device failed already; that failure is reported elsewhere
  }
}

template <class T, class A>
T Transformer<T, A>::forward(const TokenId* inputs, const TokenId* targets, bool for_backward) {
  start_forward(inputs, targets, for_backward);
  return loss();
}

template <class T, class A>
void Transformer<T, A>::start_forward(const TokenId* inputs, const TokenId* targets,
                                      bool for_backward) {
  stage_tokens(inputs, targets);
  queue_forward(for_backward);
  fence_loss();
}

template <class T, class A>
void Transformer<T, A>::stage_tokens(const TokenId* inputs, const TokenId* targets) {
  if (loss_pending_)
    throw std::logic_error("Transformer: start_forward() again before loss() was read");
  // Staged, so the uploads need not wait for the device (a plain upload waits for the stream
  // to drain: the last step's optimizer, whose end the launches after it then wait for). The
  // last forward's copies out of this memory are done: its loss() waited for them.
  std::copy(inputs, inputs + N_, staged_tokens_.data());
  std::copy(targets, targets + N_, staged_targets_.data());
}

template <class T, class A>
void Transformer<T, A>::queue_forward(bool for_backward) {
  const MemoryOps& mem = *k_.memory;
  attention_saved_ = for_backward && k_.attention_pair();
  cast_weights();
  mem.upload_async(stream(), tokens_.data(), staged_tokens_.data(), sizeof(TokenId) * size_t(N_));
  mem.upload_async(stream(), targets_.data(), staged_targets_.data(), sizeof(TokenId) * size_t(N_));
  cfg_.llama() ? forward_llama(for_backward) : forward_gpt2(for_backward);
  mem.download_async(stream(), staged_losses_.data(), losses_.data(), sizeof(T) * size_t(N_));
}

template <class T, class A>
void Transformer<T, A>::fence_loss() {
  loss_fence_ = k_.memory->fence(stream());  // null on the host, where the copies are done already
  loss_pending_ = true;
}

template <class T, class A>
void Transformer<T, A>::start_step(const TokenId* inputs, const TokenId* targets, bool accumulate) {
  const MemoryOps& mem = *k_.memory;
  if (!graph_steps_ || after_op) {
    start_forward(inputs, targets, true);
    if (!accumulate) grads_.zero(stream());
    queue_backward();
    return;
  }
  stage_tokens(inputs, targets);
  // Scratch moved by a call outside the graph (a larger request of a slot it uses) leaves the
  // graph pointing at freed memory: capture again.
  if (graph_ && graph_moves_ != contexts_.workspace_moves()) drop_graph(), graph_warm_ = true;
  // Captured without the weights' cast (the optimizer's update wrote the copy), but the
  // parameters were taken since: a graph with the cast is needed.
  if (graph_ && graph_skips_cast_ && !weights_current_) drop_graph(), graph_warm_ = true;
  if (!graph_ && graph_warm_) graph_ = capture_step();
  if (!accumulate) grads_.zero(stream());
  if (graph_) {
    mem.replay(graph_, stream());
    ++graph_replays_;
  } else {
    queue_forward(true);
    queue_backward();
    graph_warm_ = true;
  }
  fence_loss();
}

template <class T, class A>
void* Transformer<T, A>::capture_step() {
  const MemoryOps& mem = *k_.memory;
  const uint64_t calls = contexts_.calls();
  const auto give_up = [&](const std::string& why) {
    contexts_.rewind(calls);  // the step runs op by op next, drawing the seeds it draws so
    graph_steps_ = false;
    graph_failure_ = why;
    return nullptr;
  };
  try {
    mem.begin_capture(stream());
  } catch (const std::exception& e) {
    return give_up(e.what());
  }
  graph_skips_cast_ = weights_current_;
  try {
    queue_forward(true);
    queue_backward();
  } catch (const std::exception& e) {
    if (void* g = mem.end_capture(stream())) mem.release_graph(g);
    return give_up(e.what());
  }
  void* graph = mem.end_capture(stream());
  graph_moves_ = contexts_.workspace_moves();
  return graph ? graph : give_up("a call in the step could not be captured");
}

template <class T, class A>
void Transformer<T, A>::set_graph_steps(bool on) {
  graph_steps_ = on && k_.memory->begin_capture != nullptr;
  if (!graph_steps_) drop_graph();
}

template <class T, class A>
void Transformer<T, A>::drop_graph() {
  void* graph = graph_;
  graph_ = nullptr;
  graph_warm_ = false;
  if (!graph) return;
  try {
    k_.memory->synchronize(stream());  // a replay may still be running
  } catch (...) {  // the device failed already; that failure is reported elsewhere
  }
  k_.memory->release_graph(graph);
}

template <class T, class A>
T Transformer<T, A>::loss() {
  if (!loss_pending_) throw std::logic_error("Transformer: loss() without a forward");
  void* fence = loss_fence_;
  loss_fence_ = nullptr, loss_pending_ = false;
  if (fence) k_.memory->wait_fence(fence);
  // Mean in a fixed order, in double, so the reported loss is the same for any thread count.
  double sum = 0;
  for (int64_t i = 0; i < N_; ++i) sum += double(staged_losses_.data()[i]);
  return T(sum / N_);
}

template <class T, class A>
void Transformer<T, A>::backward() {
  grads_.zero(stream());
  queue_backward();
}

template <class T, class A>
void Transformer<T, A>::queue_backward() {
  dres_act_current_ = false;
  dres_.zero(stream());
  cfg_.llama() ? backward_llama() : backward_gpt2();
}

template <class T, class A>
void Transformer<T, A>::set_micro_batches(int m) {
  if (m < 1) throw std::invalid_argument("Transformer: micro-batches must be >= 1");
  micro_batches_ = m;
  drop_graph();  // the loss's gradient scale is captured in the graph
}

template class Transformer<float>;
template class Transformer<double>;
template class Transformer<float, bf16>;
}  // namespace divlab
