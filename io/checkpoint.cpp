#include "io/checkpoint.h"

#include <algorithm>

#include "common/fault.h"

namespace divlab {

namespace {
std::string slot_path(int slot) {
  return "/checkpoint/" + std::to_string(slot);
}
}  // namespace

void lay_out_checkpoints(TraceWriter& w, int64_t params, bool second_moment, int vocab) {
  using K = TraceWriter::Kind;
  for (int slot : {0, 1}) {
    const std::string g = slot_path(slot);
    w.array(g + "/next_step", K::Int64, 1);  // 0: empty or being written
    w.array(g + "/params", K::Float64, params);
    w.array(g + "/first_moment", K::Float64, params);
    w.array(g + "/second_moment", K::Float64, second_moment ? params : 1);
    w.array(g + "/token_counts", K::Int64, vocab);
  }
}

void write_checkpoint(TraceWriter& w, const Checkpoint& c, int slot) {
  const std::string g = slot_path(slot);
  w.write_array(g + "/next_step", std::vector<int64_t>{0});
  w.flush();
  fault_point("checkpoint.marked");
  w.write_array(g + "/params", c.params);
  w.write_array(g + "/first_moment", c.first_moment);
  w.write_array(g + "/second_moment",
                c.second_moment.empty() ? std::vector<double>{0.0} : c.second_moment);
  w.write_array(g + "/token_counts", c.token_counts);
  w.flush();
  fault_point("checkpoint.filled");
  w.write_array(g + "/next_step", std::vector<int64_t>{c.next_step});
  w.flush();
}

std::optional<Checkpoint> read_checkpoint(const TraceReader& r) {
  int best = -1;
  int64_t best_step = 0;
  for (int slot : {0, 1}) {
    if (!r.exists(slot_path(slot) + "/next_step")) continue;
    const int64_t step = r.ints(slot_path(slot) + "/next_step").at(0);
    if (step > best_step) best = slot, best_step = step;
  }
  if (best < 0) return std::nullopt;
  const std::string g = slot_path(best);
  Checkpoint c;
  c.next_step = best_step;
  c.params = r.floats(g + "/params");
  c.first_moment = r.floats(g + "/first_moment");
  c.second_moment = r.floats(g + "/second_moment");
  c.token_counts = r.ints(g + "/token_counts");
  return c;
}

namespace {
// Walks a group: a group with a `step` series keeps the entries of steps < next_step, and passes
// that count down to the series below it.
void collect(const TraceReader& r, const std::string& group, int64_t next_step, int64_t keep,
             std::vector<std::pair<std::string, std::vector<double>>>& out) {
  if (r.exists(group + "/step")) {
    const auto steps = r.ints(group + "/step");
    keep = std::count_if(steps.begin(), steps.end(), [&](int64_t s) { return s < next_step; });
  }
  for (const auto& name : r.children(group)) {
    const std::string path = group + "/" + name;
    if (r.is_group(path)) {
      collect(r, path, next_step, keep, out);
    } else {
      auto values = r.floats(path);
      values.resize(std::min<size_t>(values.size(), size_t(std::max<int64_t>(keep, 0))));
      out.emplace_back(path, std::move(values));
    }
  }
}
}  // namespace

std::vector<std::pair<std::string, std::vector<double>>> read_history(const TraceReader& r,
                                                                      int64_t next_step) {
  std::vector<std::pair<std::string, std::vector<double>>> out;
  for (const char* group : {"/metrics", "/eval", "/shadow", "/ranks"})
    if (r.exists(group)) collect(r, group, next_step, 0, out);
  return out;
}

}  // namespace divlab
