#include "experiments/check_train.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "analysis/report.h"
#include "common/errors.h"
#include "common/paths.h"
#include "io/toml_reader.h"

namespace divlab {

namespace {
enum class GridKind { TokenRows, Dense, SgdOnly, AdamwOnly, Bf16Weights, Llama, Ranks };

GridKind grid_kind(Op op) {
  switch (op) {
    case Op::embedding_forward:
    case Op::embed_rmsnorm_backward:
      return GridKind::TokenRows;
    case Op::sgd_step:
      return GridKind::SgdOnly;
    case Op::adamw_step:
      return GridKind::AdamwOnly;
    case Op::cast:
      return GridKind::Bf16Weights;
    case Op::rmsnorm_forward:
    case Op::rmsnorm_backward:
    case Op::linear_forward:
    case Op::linear_backward:
    case Op::attention_forward:
    case Op::attention_backward:
    case Op::gelu_forward:
    case Op::gelu_backward:
    case Op::add:
    case Op::cross_entropy:
    case Op::sum_squares:
      return GridKind::Dense;
    case Op::rope_forward:
    case Op::rope_backward:
    case Op::gqa_forward:
    case Op::gqa_backward:
    case Op::swiglu_forward:
    case Op::swiglu_backward:
    case Op::softcap_forward:
    case Op::softcap_backward:
    case Op::add_rmsnorm_forward:
      return GridKind::Llama;
    case Op::grad_reduce:
      return GridKind::Ranks;
    case Op::count:
      break;
  }
  throw std::logic_error("check --train: no grid for this op");
}

TomlValue string_value(const std::string& s) {
  TomlValue v;
  v.kind = TomlValue::Kind::String, v.text = s;
  return v;
}
TomlValue number_value(TomlValue::Kind kind, const std::string& text) {
  TomlValue v;
  v.kind = kind, v.text = text;
  return v;
}
TomlValue string_array(const std::vector<std::string>& items) {
  TomlValue v;
  v.kind = TomlValue::Kind::Array;
  for (const auto& i : items) v.items.push_back(string_value(i));
  return v;
}
bool starts_with(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}
}  // namespace

CheckTrainGrid check_train_grid(Op op, const std::vector<std::string>& arms, Backend backend,
                                Precision precision, const std::vector<std::string>& plugins) {
  const GridKind kind = grid_kind(op);
  CheckTrainGrid g;
  g.base = resource_path(kind == GridKind::TokenRows ? "configs/reproduce.toml"
                                                     : "configs/check-train.toml");
  g.quick = kind == GridKind::TokenRows;
  std::ifstream in(g.base);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) throw InputError("check --train: cannot read '" + g.base + "'");
  // Parsed, changed as values, written back: the base's own choice of kernels (and backend and
  // plug-ins) gives way to the check's.
  std::vector<TomlEntry> entries;
  entries.push_back({"set.backend", string_value(name_of(backend))});
  // Each cell loads the libraries again, and a sweep may be continued from another folder: a
  // path by location is frozen absolute (a bare name is dlopen's library search, kept as it is).
  std::vector<std::string> located;
  located.reserve(plugins.size());
  for (const std::string& p : plugins)
    located.push_back(p.find('/') == std::string::npos
                          ? p
                          : std::filesystem::absolute(p).lexically_normal().string());
  if (!located.empty()) entries.push_back({"set.plugins", string_array(located)});
  // The mode the arms were checked in (a bf16 kernel runs in no other); the bf16 weight copy
  // runs only in the bf16 mode.
  const bool bf16 = kind == GridKind::Bf16Weights || precision == Precision::Bf16;
  if (bf16) entries.push_back({"set.train.precision", string_value("bf16")});
  // The gradient reduction runs between the shards of a data-parallel step: four simulated
  // ranks of the grid's batch, without clipping (a clipped norm hides a scale error, such as a
  // missing world-size division, while the norm is above the clip).
  if (kind == GridKind::Ranks) {
    entries.push_back({"set.train.ranks", number_value(TomlValue::Kind::Integer, "4")});
    entries.push_back({"set.train.grad_clip", number_value(TomlValue::Kind::Float, "0.0")});
  }
  // The llama family's ops run in a llama model of the same size on real text (the Brown
  // corpus at 96 pieces: on the Markov chain the next token depends on the current one alone, so
  // attention, where RoPE and the kv grouping act, barely matters); 4 query heads sharing 2
  // key/value heads (so a grouping error shows), and a soft-cap the logits reach in 80 steps
  // (at Gemma's 30 these small logits would sit in its linear part and hide an omitted cap).
  const bool llama = kind == GridKind::Llama;
  if (llama) {
    entries.push_back({"set.data", string_value("brown")});
    entries.push_back({"set.model.vocab", number_value(TomlValue::Kind::Integer, "96")});
    entries.push_back({"set.model.arch", string_value("llama")});
    entries.push_back({"set.model.n_heads", number_value(TomlValue::Kind::Integer, "4")});
    entries.push_back({"set.model.n_kv_heads", number_value(TomlValue::Kind::Integer, "2")});
    entries.push_back({"set.model.logit_softcap", number_value(TomlValue::Kind::Float, "5.0")});
    // An MLP width no tile divides, like the grid's other sizes.
    entries.push_back({"set.model.mlp_hidden", number_value(TomlValue::Kind::Integer, "107")});
  }
  for (TomlEntry& e : read_toml(text.str(), "grid '" + g.base + "'")) {
    if (starts_with(e.key, "axes.kernels.") || starts_with(e.key, "set.kernels.") ||
        e.key == "set.backend" || e.key == "set.plugins" ||
        (bf16 && e.key == "set.train.precision") ||
        (kind == GridKind::Ranks &&
         (e.key == "set.train.ranks" || e.key == "set.train.grad_clip")) ||
        (llama && (e.key == "set.data" || e.key == "set.model.vocab" || e.key == "set.model.arch" ||
                   e.key == "set.model.n_heads" || e.key == "set.model.n_kv_heads" ||
                   e.key == "set.model.logit_softcap")))
      continue;
    if ((kind == GridKind::SgdOnly || kind == GridKind::AdamwOnly) &&
        e.key == "axes.train.optimizer") {
      // Only the optimizer the update serves: under the other one the candidate never runs.
      const std::string mine = kind == GridKind::SgdOnly ? "sgd" : "adamw";
      auto& items = e.value.items;
      items.erase(std::remove_if(items.begin(), items.end(),
                                 [&](const TomlValue& v) {
                                   return v.text != mine && !starts_with(v.text, mine + " ");
                                 }),
                  items.end());
    }
    entries.push_back(std::move(e));
  }
  entries.push_back({std::string("axes.kernels.") + op_name(op), string_array(arms)});
  g.text = "# divlab check --train: " + g.base +
           " with the check's kernels axis (written by divlab; the base's comments explain it)\n" +
           toml_document(entries);
  return g;
}

namespace {
std::string gap_text(const Verdict& v) {
  char b[160];
  std::snprintf(b, sizeof b, "%s (gap %+.4f, p %.2g%s)", name_of(v.verdict), v.gap, v.p_welch,
                v.onset >= 0 ? (", from step " + std::to_string(v.onset)).c_str() : "");
  return b;
}
}  // namespace

std::string train_summary(const std::string& candidate, const std::vector<Verdict>& verdicts) {
  std::vector<const Verdict*> in_order;  // the grid's order, as the matrix above
  in_order.reserve(verdicts.size());
  for (const Verdict& v : verdicts) in_order.push_back(&v);
  std::stable_sort(in_order.begin(), in_order.end(), [](const Verdict* a, const Verdict* b) {
    return a->first_cell < b->first_cell;
  });
  std::vector<std::string> changed, quiet, moved_controls, perturbed, lopsided;
  const Verdict* largest = nullptr;
  for (const Verdict* p : in_order) {
    const Verdict& v = *p;
    if (v.variant == candidate) {
      if (v.verdict == Outcome::NoDivergence) {
        quiet.push_back(v.group);
        if (!largest || std::abs(v.gap) > std::abs(largest->gap)) largest = &v;
        if (v.perturbed) perturbed.push_back(v.group + ": " + shift_words(v));
        if (v.lopsided) {
          char b[128];
          std::snprintf(b, sizeof b,
                        ": %d of %d seeds, median gap %+.4f, mean %+.4f, p %.2g by Welch's t",
                        v.seeds_one_way, v.seeds, v.median_gap, v.gap, v.p_welch);
          lopsided.push_back(v.group + b);
        }
      } else {
        changed.push_back(v.group + ": " +
                          (v.no_verdict_reason.empty()
                               ? gap_text(v)
                               : name_of(v.verdict) + (" (" + v.no_verdict_reason + ")")));
      }
    } else if (v.control && v.verdict != Outcome::NoDivergence) {
      moved_controls.push_back(v.variant + " in " + v.group + ": " + name_of(v.verdict));
    }
  }
  const size_t groups = changed.size() + quiet.size();
  std::string s = "summary: " + candidate;
  if (candidate.size() > 10 && candidate.compare(candidate.size() - 10, 10, "=reference") == 0) {
    // The reference is the baseline every arm is measured against: what moved is its controls.
    size_t controls = 0;
    for (const Verdict& v : verdicts) controls += v.control;
    return s + " is the baseline here: " +
           (moved_controls.empty()
                ? "its controls stayed within the noise floor in all " + std::to_string(controls) +
                      " of their groups\n"
                : std::to_string(moved_controls.size()) + " of " + std::to_string(controls) +
                      " control groups moved (below)\n") +
           [&] {
             std::string notes;
             for (const auto& c : moved_controls) notes += "note: the control " + c + "\n";
             return notes;
           }();
  }
  if (groups == 0) return s + ": no verdicts (the grid's cells did not finish)\n";
  if (changed.empty()) {
    // What the verdict tested is the mean gap; how far single runs moved is the notes' to say.
    char b[96];
    std::snprintf(b, sizeof b, "; largest gap %+.4f, p %.2g", largest ? largest->gap : 0.0,
                  largest ? largest->p_welch : 1.0);
    s += " moved no group's mean loss past its controls' noise floor (" + std::to_string(groups) +
         (groups == 1 ? " group" : " groups") + b + ")" +
         (!lopsided.empty() ? ": no verdict, but the seeds moved one way (below)"
          : perturbed.empty()
              ? ": this grid shows no effect on the loss"
              : ": no consistent effect on the loss, but it perturbs every run (below)");
  } else {
    s += " changed training in " + std::to_string(changed.size()) + " of " +
         std::to_string(groups) + " groups: ";
    for (size_t i = 0; i < changed.size(); ++i) s += (i ? "; " : "") + changed[i];
    if (!quiet.empty()) {
      s += "; no divergence in ";
      for (size_t i = 0; i < quiet.size(); ++i) s += (i ? ", " : "") + quiet[i];
    }
  }
  s += "\n";
  for (const auto& g : perturbed)
    s += "note: perturbed, in no consistent direction, in " + g + "\n";
  for (const auto& g : lopsided)
    s += "note: lopsided, the seeds one way but some far beyond the rest, which Welch's t does "
         "not call, in " +
         g + " (more seeds settle it: docs/analysis.md)\n";
  for (const auto& c : moved_controls)
    s += "note: the control " + c + " (the noise floor there is not settled)\n";
  return s;
}

}  // namespace divlab
