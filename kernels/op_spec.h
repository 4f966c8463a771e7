// What every argument of an op call is: the one description of "how to call op X" that shadow
// mode (recording and replaying any op), the bf16 adapters (which arguments to widen and which to
// round back) and their tests iterate, instead of each writing every op out by hand.
//
// OpSpec<op>::args(tuple of the call's arguments after the context) returns one ArgSpec per
// argument, in order: its role and, for arrays, its extent as rows x cols computed from the
// call's own size arguments (every op's arguments determine its arrays' sizes; embedding_forward
// takes its vocabulary for that alone). "Output" means judged on
// its value: a kernel may also read it (AdamW's second moment).
#pragma once

#include <array>
#include <cstdint>
#include <tuple>
#include <type_traits>

#include "kernels/op_list.h"
#include "kernels/ops.h"

namespace divlab {

enum class ArgRole {
  Input,       // an array the op reads
  TokenIds,    // token ids or targets (read)
  Output,      // an array the op overwrites (may be null where ops.h says so)
  Accumulate,  // an array the op adds into (parameter gradients, dresid)
  Saved,       // an output in the kernel's own format, read only by its partner (attention's
               // probabilities; the fused forward leaves them alone): never compared
  Value        // a size or a scalar
};
// How an output's rows map to the batch's tokens: by position (row n is token n of the batch), by
// token id (row v is id v's row), or not at all.
enum class RowKey { Position, TokenId, None };

struct ArgSpec {
  ArgRole role = ArgRole::Value;
  int64_t rows = 0, cols = 0;
  RowKey key = RowKey::None;
  int64_t size() const { return rows * cols; }
  bool is_written() const {
    return role == ArgRole::Output || role == ArgRole::Accumulate || role == ArgRole::Saved;
  }
};

namespace arg {
inline ArgSpec in(int64_t rows, int64_t cols) {
  return {ArgRole::Input, rows, cols, RowKey::None};
}
inline ArgSpec ids(int64_t n) {
  return {ArgRole::TokenIds, n, 1, RowKey::None};
}
inline ArgSpec out(int64_t rows, int64_t cols, RowKey key) {
  return {ArgRole::Output, rows, cols, key};
}
inline ArgSpec acc(int64_t rows, int64_t cols, RowKey key) {
  return {ArgRole::Accumulate, rows, cols, key};
}
inline ArgSpec saved(int64_t rows, int64_t cols) {
  return {ArgRole::Saved, rows, cols, RowKey::None};
}
inline ArgSpec value() {
  return {};
}
}  // namespace arg

template <Op op>
struct OpSpec {
  static constexpr bool known = false;
};

#define DIVLAB_OP_SPEC(op_name)         \
  template <>                           \
  struct OpSpec<Op::op_name> {          \
    static constexpr bool known = true; \
    template <class Args>               \
    static auto args(const Args& a);    \
  };                                    \
  template <class Args>                 \
  auto OpSpec<Op::op_name>::args(const Args& a)

using std::get;

// x, tokens, wte, wpe, B, T, C, V
DIVLAB_OP_SPEC(embedding_forward) {
  const int64_t B = get<4>(a), T = get<5>(a), C = get<6>(a), V = get<7>(a);
  using namespace arg;
  return std::array{out(B * T, C, RowKey::Position),
                    ids(B * T),
                    in(V, C),
                    in(T, C),
                    value(),
                    value(),
                    value(),
                    value()};
}
// y, rstd, x, w, N, C, eps
DIVLAB_OP_SPEC(rmsnorm_forward) {
  const int64_t N = get<4>(a), C = get<5>(a);
  using namespace arg;
  return std::array{out(N, C, RowKey::Position),
                    out(N, 1, RowKey::Position),
                    in(N, C),
                    in(1, C),
                    value(),
                    value(),
                    value()};
}
// dresid, dw, dy, x, w, rstd, N, C
DIVLAB_OP_SPEC(rmsnorm_backward) {
  const int64_t N = get<6>(a), C = get<7>(a);
  using namespace arg;
  return std::array{acc(N, C, RowKey::Position),
                    acc(1, C, RowKey::None),
                    in(N, C),
                    in(N, C),
                    in(1, C),
                    in(N, 1),
                    value(),
                    value()};
}
// y, x, W, N, in, out
DIVLAB_OP_SPEC(linear_forward) {
  const int64_t N = get<3>(a), I = get<4>(a), O = get<5>(a);
  using namespace arg;
  return std::array{out(N, O, RowKey::Position), in(N, I), in(O, I), value(), value(), value()};
}
// dx, dW, dy, x, W, N, in, out
DIVLAB_OP_SPEC(linear_backward) {
  const int64_t N = get<5>(a), I = get<6>(a), O = get<7>(a);
  using namespace arg;
  return std::array{out(N, I, RowKey::Position),
                    acc(O, I, RowKey::None),
                    in(N, O),
                    in(N, I),
                    in(O, I),
                    value(),
                    value(),
                    value()};
}
// out, att, qkv, B, T, C, NH
DIVLAB_OP_SPEC(attention_forward) {
  const int64_t B = get<3>(a), T = get<4>(a), C = get<5>(a), NH = get<6>(a);
  using namespace arg;
  return std::array{out(B * T, C, RowKey::Position),
                    saved(B * NH * T, T),
                    in(B * T, 3 * C),
                    value(),
                    value(),
                    value(),
                    value()};
}
// dqkv, dout, qkv, att, B, T, C, NH
DIVLAB_OP_SPEC(attention_backward) {
  const int64_t B = get<4>(a), T = get<5>(a), C = get<6>(a), NH = get<7>(a);
  using namespace arg;
  return std::array{out(B * T, 3 * C, RowKey::Position),
                    in(B * T, C),
                    in(B * T, 3 * C),
                    in(B * NH * T, T),
                    value(),
                    value(),
                    value(),
                    value()};
}
// y, x, n
DIVLAB_OP_SPEC(gelu_forward) {
  const int64_t n = get<2>(a);
  using namespace arg;
  return std::array{out(1, n, RowKey::None), in(1, n), value()};
}
// dx, dy, x, n
DIVLAB_OP_SPEC(gelu_backward) {
  const int64_t n = get<3>(a);
  using namespace arg;
  return std::array{out(1, n, RowKey::None), in(1, n), in(1, n), value()};
}
// y, a, b, n
DIVLAB_OP_SPEC(add) {
  const int64_t n = get<3>(a);
  using namespace arg;
  return std::array{out(1, n, RowKey::None), in(1, n), in(1, n), value()};
}
// losses, dlogits, logits, targets, N, V, dloss
DIVLAB_OP_SPEC(cross_entropy) {
  const int64_t N = get<4>(a), V = get<5>(a);
  using namespace arg;
  return std::array{out(N, 1, RowKey::Position),
                    out(N, V, RowKey::Position),
                    in(N, V),
                    ids(N),
                    value(),
                    value(),
                    value()};
}
// dwte, dwpe, dw_norm, dy_norm, dresid, x0, w_norm, rstd, tokens, B, T, C, V
DIVLAB_OP_SPEC(embed_rmsnorm_backward) {
  const int64_t N = int64_t(get<9>(a)) * get<10>(a), T = get<10>(a), C = get<11>(a), V = get<12>(a);
  using namespace arg;
  return std::array{acc(V, C, RowKey::TokenId),
                    acc(T, C, RowKey::None),
                    acc(1, C, RowKey::None),
                    in(N, C),
                    in(N, C),
                    in(N, C),
                    in(1, C),
                    in(N, 1),
                    ids(N),
                    value(),
                    value(),
                    value(),
                    value()};
}
// y, x, n
DIVLAB_OP_SPEC(cast) {
  const int64_t n = get<2>(a);
  using namespace arg;
  return std::array{out(1, n, RowKey::None), in(1, n), value()};
}
// out (one double), g, n
DIVLAB_OP_SPEC(sum_squares) {
  const int64_t n = get<2>(a);
  using namespace arg;
  return std::array{out(1, 1, RowKey::None), in(1, n), value()};
}
// p, momentum_buf, g, n, lr, momentum, nesterov, weight_decay, grad_scale. Parameters and momenta
// are updated in place: judged on the step's change to them, as an accumulated output is.
DIVLAB_OP_SPEC(sgd_step) {
  const int64_t n = get<3>(a);
  using namespace arg;
  return std::array{acc(1, n, RowKey::None),
                    acc(1, n, RowKey::None),
                    in(1, n),
                    value(),
                    value(),
                    value(),
                    value(),
                    value(),
                    value()};
}
// p, m, v, g, n, lr, beta1, beta2, eps, weight_decay, grad_scale, step. The second moment v is
// read and rewritten too, but judged on its value (an Output): a pre-fill could make it negative.
DIVLAB_OP_SPEC(adamw_step) {
  const int64_t n = get<4>(a);
  using namespace arg;
  return std::array{acc(1, n, RowKey::None),
                    acc(1, n, RowKey::None),
                    out(1, n, RowKey::None),
                    in(1, n),
                    value(),
                    value(),
                    value(),
                    value(),
                    value(),
                    value(),
                    value(),
                    value()};
}
// out, shards, ranks, n: one gradient from `ranks` stacked ones.
DIVLAB_OP_SPEC(grad_reduce) {
  const int64_t ranks = get<2>(a), n = get<3>(a);
  using namespace arg;
  return std::array{out(1, n, RowKey::None), in(ranks, n), value(), value()};
}
// y, x, B, T, NH, NKV, HD, base
DIVLAB_OP_SPEC(rope_forward) {
  const int64_t N = int64_t(get<2>(a)) * get<3>(a);
  const int64_t W = (int64_t(get<4>(a)) + 2 * get<5>(a)) * get<6>(a);
  using namespace arg;
  return std::array{
      out(N, W, RowKey::Position), in(N, W), value(), value(), value(), value(), value(), value()};
}
// dx, dy, B, T, NH, NKV, HD, base
DIVLAB_OP_SPEC(rope_backward) {
  const int64_t N = int64_t(get<2>(a)) * get<3>(a);
  const int64_t W = (int64_t(get<4>(a)) + 2 * get<5>(a)) * get<6>(a);
  using namespace arg;
  return std::array{
      out(N, W, RowKey::Position), in(N, W), value(), value(), value(), value(), value(), value()};
}
// qkv, x, N, NH, NKV, HD
DIVLAB_OP_SPEC(gqa_forward) {
  const int64_t N = get<2>(a), NH = get<3>(a), NKV = get<4>(a), HD = get<5>(a);
  using namespace arg;
  return std::array{out(N, 3 * NH * HD, RowKey::Position),
                    in(N, (NH + 2 * NKV) * HD),
                    value(),
                    value(),
                    value(),
                    value()};
}
// dx, dqkv, N, NH, NKV, HD
DIVLAB_OP_SPEC(gqa_backward) {
  const int64_t N = get<2>(a), NH = get<3>(a), NKV = get<4>(a), HD = get<5>(a);
  using namespace arg;
  return std::array{out(N, (NH + 2 * NKV) * HD, RowKey::Position),
                    in(N, 3 * NH * HD),
                    value(),
                    value(),
                    value(),
                    value()};
}
// y, x, N, F
DIVLAB_OP_SPEC(swiglu_forward) {
  const int64_t N = get<2>(a), F = get<3>(a);
  using namespace arg;
  return std::array{out(N, F, RowKey::Position), in(N, 2 * F), value(), value()};
}
// dx, dy, x, N, F
DIVLAB_OP_SPEC(swiglu_backward) {
  const int64_t N = get<3>(a), F = get<4>(a);
  using namespace arg;
  return std::array{out(N, 2 * F, RowKey::Position), in(N, F), in(N, 2 * F), value(), value()};
}
// y, x, n, cap
DIVLAB_OP_SPEC(softcap_forward) {
  const int64_t n = get<2>(a);
  using namespace arg;
  return std::array{out(1, n, RowKey::None), in(1, n), value(), value()};
}
// dx, dy, x, n, cap
DIVLAB_OP_SPEC(softcap_backward) {
  const int64_t n = get<3>(a);
  using namespace arg;
  return std::array{out(1, n, RowKey::None), in(1, n), in(1, n), value(), value()};
}
// xout, y, rstd, a, b, w, B, T, C, eps
DIVLAB_OP_SPEC(add_rmsnorm_forward) {
  const int64_t N = int64_t(get<6>(a)) * get<7>(a), C = get<8>(a);
  using namespace arg;
  return std::array{out(N, C, RowKey::Position),
                    out(N, C, RowKey::Position),
                    out(N, 1, RowKey::Position),
                    in(N, C),
                    in(N, C),
                    in(1, C),
                    value(),
                    value(),
                    value(),
                    value()};
}
#undef DIVLAB_OP_SPEC

// The argument types of an op's function type, after the context.
template <class Fn>
struct OpArgs;
template <class... Args>
struct OpArgs<void (*)(const OpContext&, Args...)> {
  using Tuple = std::tuple<Args...>;
  static constexpr size_t count = sizeof...(Args);
};

}  // namespace divlab
