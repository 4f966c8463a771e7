#include "experiments/weights.h"

#include "common/errors.h"
#include "io/checkpoint.h"

namespace divlab {

namespace {
std::string tensor_path(WhichWeights which, const ParamInfo& p) {
  return std::string("/weights/") + name_of(which) + "/" + p.name;
}
}  // namespace

void lay_out_weights(TraceWriter& w, WhichWeights which, const std::vector<ParamInfo>& layout) {
  for (const ParamInfo& p : layout)
    w.array(tensor_path(which, p), TraceWriter::Kind::Float64, p.shape);
  if (which == WhichWeights::Final) w.array("/weights/final_step", TraceWriter::Kind::Int64, 1);
}

void write_weights(TraceWriter& w, WhichWeights which, const std::vector<ParamInfo>& layout,
                   const std::vector<double>& params, int64_t step) {
  for (const ParamInfo& p : layout)
    w.write_array(tensor_path(which, p), std::vector<double>(params.begin() + p.offset,
                                                             params.begin() + p.offset + p.size));
  if (which == WhichWeights::Final)
    w.write_array("/weights/final_step", std::vector<int64_t>{step});
}

std::optional<std::vector<double>> read_weights(const TraceReader& r, WhichWeights which,
                                                const std::vector<ParamInfo>& layout) {
  if (layout.empty() || !r.exists(tensor_path(which, layout[0]))) return std::nullopt;
  std::vector<double> params;
  for (const ParamInfo& p : layout) {
    const std::vector<double> t = r.tensor(tensor_path(which, p));
    if (int64_t(t.size()) != p.size)
      throw InputError("trace: '" + tensor_path(which, p) + "' holds " + std::to_string(t.size()) +
                       " values, the model's " + p.name + " " + std::to_string(p.size));
    params.insert(params.end(), t.begin(), t.end());
  }
  return params;
}

std::optional<TraceWeights> trace_weights(const TraceReader& r, WhichWeights which,
                                          const std::vector<ParamInfo>& layout) {
  if (which == WhichWeights::Checkpoint) {
    const auto c = read_checkpoint(r);
    if (!c) return std::nullopt;
    return TraceWeights{c->params, c->next_step};
  }
  auto params = read_weights(r, which, layout);
  if (!params) return std::nullopt;
  return TraceWeights{std::move(*params),
                      which == WhichWeights::Final ? r.ints("/weights/final_step").at(0) : 0};
}

std::string no_checkpoint_message(const TraceReader& r, const std::string& path) {
  return "trace '" + path +
         "': holds no checkpoint (checkpoint.every = 0, or the run ended before its first; the "
         "last step writes none" +
         (r.exists("/weights/final_step") ? ": its weights are the final ones, --weights final)"
                                          : ")");
}

}  // namespace divlab
