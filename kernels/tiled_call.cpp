// call_op_tiled (kernels/op_cases.h): one call of an op with its rows repeated, judged copy by
// copy against the base call.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/guarded_workspace.h"
#include "kernels/invoke_op.h"
#include "kernels/op_cases.h"
#include "kernels/plugin_calls.h"
#include "kernels/tiled_arrays.h"

namespace divlab {

OpShape tiled_shape(const OpShape& s, int copies) {
  OpShape big = s;
  big.B *= copies;
  return big;
}

namespace {
// The same dloss (dloss_scale / N) at `copies` times the rows.
OpScalars tiled_scalars(OpScalars c, int copies) {
  c.dloss_scale *= copies;
  return c;
}
std::vector<TokenId> tiled_ids(const std::vector<TokenId>& ids, int copies) {
  std::vector<TokenId> all;
  all.reserve(ids.size() * size_t(copies));
  for (int c = 0; c < copies; ++c) all.insert(all.end(), ids.begin(), ids.end());
  return all;
}
// The largest |a - b| (NaN where only one side is NaN: infinite).
double distance(const std::vector<double>& a, const std::vector<double>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double e = std::abs(a[i] - b[i]);
    if (!std::isnan(e))
      d = std::max(d, e);
    else if (std::isnan(a[i]) != std::isnan(b[i]))
      return INFINITY;
  }
  return d;
}
}  // namespace

template <class KS>
size_t tiled_call_bytes(const std::string& op, const KS& k, const OpInputs& x, const OpShape& s,
                        int copies) {
  std::vector<ArgProbe> in(x.values.size()), out(x.outputs.size());
  invoke_op(op_named(op), no_op_kernels(k), OpContext{}, in, nullptr, out, tiled_shape(s, copies),
            tiled_scalars(x.scalars, copies), nullptr);
  size_t bytes = x.ids.size() * size_t(copies) * sizeof(TokenId);
  for (auto* arrays : {&in, &out})
    for (const ArgProbe& a : *arrays)
      // An adapter (a plug-in written for another activation type) holds each array once more,
      // in fp32 at most.
      bytes += a.bytes() + size_t(a.count) * sizeof(float);
  return bytes;
}

template <class KS>
OpRun call_op_tiled(const std::string& op, const KS& k, const OpInputs& x, const OpShape& s,
                    int copies, const OpRun& expect, int* chosen, const KernelCallMarks* marks) {
  std::vector<TiledArray> in, out;
  for (const auto& v : x.values) in.emplace_back(*k.memory, v, kGuardValues);
  for (const auto& v : x.outputs) out.emplace_back(*k.memory, v, kGuardValues);
  BoundIds ids(*k.memory, tiled_ids(x.ids, copies), kGuardValues);
  GuardedContexts contexts(*k.memory, kPluginWorkspaceSlot);
  const OpContext ctx = contexts.next();
  if (marks) marks->begin();
  invoke_op(op_named(op), k, ctx, in, ids.data(), out, tiled_shape(s, copies),
            tiled_scalars(x.scalars, copies), nullptr);
  k.memory->synchronize(ctx.stream);
  if (marks) marks->end();

  // Each copy's largest distance from the base call's outputs, over every output that grows
  // with the rows; a copy with the same bits as the first is as far.
  std::vector<double> by(size_t(copies), 0.0);
  for (size_t o = 0; o < out.size(); ++o) {
    if (!out[o].bound() || out[o].summed(copies)) continue;
    std::vector<unsigned char> first;
    double first_by = 0;
    for (int c = 0; c < copies; ++c) {
      std::vector<unsigned char> now = out[o].copy_bytes(c);
      const double d =
          c > 0 && now == first ? first_by : distance(out[o].widened(now), expect.outputs[o]);
      if (c == 0) first = std::move(now), first_by = d;
      by[size_t(c)] = std::max(by[size_t(c)], d);
    }
  }
  const int pick = int(std::max_element(by.begin(), by.end()) - by.begin());
  if (chosen) *chosen = pick;

  OpRun r;
  for (size_t o = 0; o < out.size(); ++o) {
    if (!out[o].bound()) {
      r.outputs.push_back(x.outputs[o]);
      r.summed.push_back(false);
      continue;
    }
    const bool summed = out[o].summed(copies);
    r.summed.push_back(summed);
    if (summed && out[o].role() != ArgRole::Accumulate)  // a total over the rows, not a share
      throw std::logic_error(
          "tiled call: an output that does not grow with the rows must be "
          "one they add into");
    std::vector<double> v = out[o].widened(out[o].copy_bytes(summed ? 0 : pick));
    if (summed)  // the base call's share of a sum over every copy's rows
      for (size_t i = 0; i < v.size(); ++i)
        v[i] = x.outputs[o][i] + (v[i] - x.outputs[o][i]) / copies;
    r.outputs.push_back(std::move(v));
    const auto [before, after] = out[o].guards_changed();
    note_output_guards(o, before, after, &r.stray_writes);
  }
  note_input_changes(in, ids, &r.stray_writes);
  contexts.add_stray_writes(&r.stray_writes);
  return r;
}

template size_t tiled_call_bytes(const std::string&, const KernelSet<double>&, const OpInputs&,
                                 const OpShape&, int);
template size_t tiled_call_bytes(const std::string&, const KernelSet<float>&, const OpInputs&,
                                 const OpShape&, int);
template size_t tiled_call_bytes(const std::string&, const KernelSet<float, bf16>&, const OpInputs&,
                                 const OpShape&, int);
template OpRun call_op_tiled(const std::string&, const KernelSet<double>&, const OpInputs&,
                             const OpShape&, int, const OpRun&, int*, const KernelCallMarks*);
template OpRun call_op_tiled(const std::string&, const KernelSet<float>&, const OpInputs&,
                             const OpShape&, int, const OpRun&, int*, const KernelCallMarks*);
template OpRun call_op_tiled(const std::string&, const KernelSet<float, bf16>&, const OpInputs&,
                             const OpShape&, int, const OpRun&, int*, const KernelCallMarks*);

}  // namespace divlab
