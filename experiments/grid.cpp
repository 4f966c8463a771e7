#include "experiments/grid.h"

#include <algorithm>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>

#include "common/files.h"
#include "common/sha256.h"
#include "common/signals.h"
#include "datasets/dataset.h"
#include "experiments/config.h"
#include "experiments/train.h"
#include "io/toml_reader.h"

namespace divlab {

namespace {
// A value as `--set` text: strings as they are (an axis string may carry "key=value" words
// after its value), everything else as TOML.
std::string value_text(const TomlValue& v) {
  return v.kind == TomlValue::Kind::String ? v.text : v.toml();
}

std::vector<std::string> axis_values(const TomlEntry& e, const std::string& path,
                                     const std::string& axis) {
  if (e.value.kind != TomlValue::Kind::Array)
    throw InputError("grid '" + path + "' line " + std::to_string(e.value.line) + ": axis '" +
                     axis + "' must be an array of values, got " + e.value.describe());
  if (e.value.items.empty())
    throw InputError("grid '" + path + "': axis '" + axis + "' has no values");
  std::vector<std::string> out;
  for (const auto& item : e.value.items) out.push_back(value_text(item));
  return out;
}

void set_or_replace(std::vector<std::string>& overrides, const std::string& key,
                    const std::string& value) {
  for (auto& o : overrides)
    if (o.substr(0, o.find('=')) == key) {
      o = key + "=" + value;
      return;
    }
  overrides.push_back(key + "=" + value);
}
}  // namespace

namespace {
// One Cartesian product of a grid: the grid's own [set]/[axes], or a [parts.NAME] table's
// (which adds to and overrides the grid's).
struct Part {
  std::string name;
  std::vector<std::string> fixed;
  std::vector<std::pair<std::string, std::vector<std::string>>> axes;
};

void add_axis(std::vector<std::pair<std::string, std::vector<std::string>>>& axes,
              const std::string& key, const std::vector<std::string>& values) {
  for (auto& a : axes)
    if (a.first == key) {
      a.second = values;
      return;
    }
  axes.emplace_back(key, values);
}

// Appends the cells of one part (last axis fastest) to g; refuses a grid past kMaxGridCells
// before allocating a cell of it.
void expand(Grid& g, const Part& part, const std::string& path) {
  size_t total = 1;
  std::string product;
  for (const auto& a : part.axes) {
    product += (product.empty() ? "" : " x ") + std::to_string(a.second.size());
    total = std::min(total * a.second.size(), kMaxGridCells + 1);  // no overflow past the cap
  }
  if (g.cells.size() + total > kMaxGridCells)
    throw InputError(
        "grid '" + path + "': " + (part.name.empty() ? "" : "part '" + part.name + "': ") +
        "more than " + std::to_string(kMaxGridCells) + " cells (axes of " + product + " values" +
        (g.cells.empty() ? "" : ", after " + std::to_string(g.cells.size()) + " cells") +
        "); split the grid into several");
  for (size_t i = 0; i < total; ++i) {
    std::vector<std::string> cell = part.fixed;
    size_t rest = i;
    // Each axis's extras, in file order: where two axes' values bring the same key, the later
    // axis's wins, as [axes] override [set] ("adamw train.lr=3e-3" after a data value's lr).
    std::vector<std::string> picks(part.axes.size());
    std::vector<std::vector<std::string>> extras(part.axes.size());
    for (size_t a = part.axes.size(); a-- > 0;) {
      // "adamw train.lr=3e-3": the value, then overrides that come with it.
      std::istringstream words(part.axes[a].second[rest % part.axes[a].second.size()]);
      std::string value, extra;
      words >> value;
      picks[a] = part.axes[a].first + "=" + value;
      while (words >> extra) {
        if (extra.find('=') == std::string::npos)
          throw InputError("grid '" + path + "': axis '" + part.axes[a].first + "' value '" +
                           words.str() + "': words after the value must be key=value");
        // A cell is labelled and analysed by its axes' values: a word that set an axis's key
        // (its own or another's) would run a value other than the one its label names.
        const std::string key = extra.substr(0, extra.find('='));
        const bool axis_key = std::any_of(part.axes.begin(), part.axes.end(),
                                          [&](const auto& axis) { return axis.first == key; });
        const bool repeated = std::any_of(extras[a].begin(), extras[a].end(), [&](const auto& e) {
          return e.substr(0, e.find('=')) == key;
        });
        if (axis_key || repeated)
          throw InputError("grid '" + path + "': axis '" + part.axes[a].first + "' value '" +
                           words.str() + "': '" + extra + "' sets " +
                           (axis_key ? "'" + key +
                                           "', an axis of the grid (a cell's label would "
                                           "name one value and the run use another)"
                                     : "'" + key + "' twice"));
        extras[a].push_back(extra);
      }
      rest /= part.axes[a].second.size();
    }
    for (const auto& brought : extras) picks.insert(picks.end(), brought.begin(), brought.end());
    for (const auto& p : picks) {
      // An axis overrides a fixed value of the same key.
      const std::string key = p.substr(0, p.find('='));
      cell.erase(
          std::remove_if(cell.begin(), cell.end(),
                         [&](const std::string& o) { return o.substr(0, o.find('=')) == key; }),
          cell.end());
    }
    cell.insert(cell.end(), picks.begin(), picks.end());
    std::string label = part.name.empty() ? "" : "[" + part.name + "]";
    for (const auto& p : picks) label += (label.empty() ? "" : " ") + p;
    g.labels.push_back(label);
    g.cells.push_back(cell);
  }
}
}  // namespace

Grid load_grid(const std::string& path, bool quick, uint64_t seed_offset,
               const std::string& base_config) {
  Grid g;
  g.path = path;
  const std::vector<TomlEntry> entries =
      read_toml(read_input_file(path, "grid"), "grid '" + path + "'");
  std::vector<std::pair<std::string, std::vector<std::string>>> quick_axes;
  std::vector<Part> parts;
  bool has_quick = false;
  auto part_named = [&](const std::string& name) -> Part& {
    for (auto& p : parts)
      if (p.name == name) return p;
    parts.push_back({name, {}, {}});
    return parts.back();
  };
  for (const TomlEntry& e : entries) {
    std::vector<std::string> k;
    std::stringstream names(e.key);
    for (std::string name; std::getline(names, name, '.');) k.push_back(name);
    auto tail = [&](size_t from) {
      std::string t;
      for (size_t i = from; i < k.size(); ++i) t += (t.empty() ? "" : ".") + k[i];
      return t;
    };
    if (k.size() == 1 && k[0] == "config") {
      if (e.value.kind != TomlValue::Kind::String || e.value.text.empty())
        throw InputError("grid '" + path + "' line " + std::to_string(e.value.line) +
                         ": 'config' must be a path (a string), got " + e.value.describe());
      const std::string dir =
          path.find('/') == std::string::npos ? "." : path.substr(0, path.find_last_of('/'));
      g.base_config = !base_config.empty()          ? base_config
                      : e.value.text.front() == '/' ? e.value.text
                                                    : dir + "/" + e.value.text;
    } else if (k[0] == "slurm" && k.size() == 2) {
      static const std::map<std::string, TomlValue::Kind> kSlurmKeys = {
          {"time", TomlValue::Kind::String},           {"mem", TomlValue::Kind::String},
          {"partition", TomlValue::Kind::String},      {"account", TomlValue::Kind::String},
          {"gpus_per_task", TomlValue::Kind::Integer}, {"cpus_per_task", TomlValue::Kind::Integer},
          {"setup", TomlValue::Kind::String}};
      const auto it = kSlurmKeys.find(k[1]);
      if (it == kSlurmKeys.end())
        throw InputError("grid '" + path + "' line " + std::to_string(e.value.line) +
                         ": unknown key '" + e.key +
                         "' ([slurm] has time, mem, partition, account, gpus_per_task, "
                         "cpus_per_task and setup)");
      if (e.value.kind != it->second)
        throw InputError("grid '" + path + "' line " + std::to_string(e.value.line) + ": '" +
                         e.key + "' must be " +
                         (it->second == TomlValue::Kind::String ? "a string" : "an integer") +
                         ", got " + e.value.describe());
      g.slurm[k[1]] = e.value.text;
    } else if (k[0] == "set" && k.size() > 1) {
      set_or_replace(g.fixed, tail(1), value_text(e.value));
    } else if (k[0] == "axes" && k.size() > 1) {
      g.axes.emplace_back(tail(1), axis_values(e, path, tail(1)));
    } else if (k[0] == "parts" && k.size() > 3 && (k[2] == "set" || k[2] == "axes")) {
      Part& part = part_named(k[1]);
      if (k[2] == "set")
        set_or_replace(part.fixed, tail(3), value_text(e.value));
      else
        add_axis(part.axes, tail(3), axis_values(e, path, k[1] + ": " + tail(3)));
    } else if (k[0] == "quick" && k.size() > 2 && (k[1] == "set" || k[1] == "axes")) {
      has_quick = true;
      if (!quick) continue;
      if (k[1] == "set")
        set_or_replace(g.fixed, tail(2), value_text(e.value));
      else
        quick_axes.emplace_back(tail(2), axis_values(e, path, tail(2)));
    } else {
      throw InputError("grid '" + path + "' line " + std::to_string(e.value.line) +
                       ": unknown key '" + e.key +
                       "' (a grid has config, [set...], [axes...], [parts.NAME.set/axes...], "
                       "[quick.set/axes...] and [slurm])");
    }
  }
  // Otherwise --quick would run the whole grid, which is what it was asked not to do.
  if (quick && !has_quick)
    throw InputError("--quick: grid '" + path +
                     "' has no [quick.set] or [quick.axes] (nothing makes it shorter)");
  for (const auto& [key, values] : quick_axes) add_axis(g.axes, key, values);
  if (parts.empty()) {
    if (g.axes.empty()) throw InputError("grid '" + path + "': no [axes] (nothing to sweep)");
    expand(g, Part{"", g.fixed, g.axes}, path);
  }
  for (const Part& own : parts) {
    // The grid's [set] and [axes], then the part's, which override keys they share.
    Part part{own.name, g.fixed, g.axes};
    for (const auto& o : own.fixed)
      set_or_replace(part.fixed, o.substr(0, o.find('=')), o.substr(o.find('=') + 1));
    for (const auto& [key, values] : own.axes) add_axis(part.axes, key, values);
    expand(g, part, path);
  }
  // Every cell must be a valid run: bad keys and values are reported before anything runs.
  g.base_config_text =
      g.base_config.empty() ? "" : read_input_file(g.base_config, "grid '" + path + "': config");
  std::string identity = g.base_config_text;
  std::map<std::string, size_t> resolved;  // a cell's whole resolved config -> the cell
  for (size_t i = 0; i < g.cells.size(); ++i) {
    // A large grid takes seconds to check, and nothing is written yet: a stop ends it here.
    if (const int sig = stop_signal(); sig != 0) end_by_signal(sig);
    try {
      RunConfig cfg = parse_config_text(g.base_config_text, g.base_config, g.cells[i]);
      if (seed_offset != 0) {  // fresh seeds: every cell's seed moved by the same offset
        // A seed is a config integer: at most 2^63 - 1.
        constexpr uint64_t kMaxSeed = std::numeric_limits<int64_t>::max();
        if (seed_offset > kMaxSeed || cfg.seed > kMaxSeed - seed_offset)
          throw InputError("--seed-offset " + std::to_string(seed_offset) +
                           ": train.seed + offset exceeds 2^63 - 1");
        set_or_replace(g.cells[i], "train.seed", std::to_string(cfg.seed + seed_offset));
        cfg = parse_config_text(g.base_config_text, g.base_config, g.cells[i]);
      }
      resolve_kernels(cfg);  // its kernel names, against its backend (plug-ins loaded once)
      if (cfg.backend == Backend::Cuda && g.first_cuda_cell < 0) g.first_cuda_cell = int64_t(i);
      g.host_bytes.push_back(run_host_bytes(cfg));
      check_dataset_source(cfg.data);  // a missing corpus, before any cell runs
      // Two cells that resolve to one run (a repeated axis value, 0.1 beside 1e-1, one axis
      // given twice) would count one experiment twice as two seeds' worth.
      const auto [at, fresh] = resolved.emplace(cfg.to_toml(), i);
      if (!fresh)
        throw InputError("resolves to the same run as cell " + std::to_string(at->second) + " (" +
                         g.describe(at->second) + "); every cell must differ");
    } catch (const InputError& e) {
      throw InputError("grid '" + path + "', cell " + std::to_string(i) + " (" + g.describe(i) +
                       "): " + e.what());
    }
    for (const auto& o : g.cells[i]) identity += "\n" + o;
    identity += "\n--";
  }
  g.id = sha256_hex(identity);
  return g;
}

}  // namespace divlab
