#include "experiments/grid.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>

#include "datasets/text.h"
#include "experiments/config.h"
#include "experiments/files.h"

namespace divlab {

namespace {
std::string value_text(const std::vector<std::string>& inputs) {
  if (inputs.size() == 1) return inputs[0];
  std::string s = "[";
  for (size_t i = 0; i < inputs.size(); ++i) s += (i ? "," : "") + inputs[i];
  return s + "]";
}

std::string read_all(const std::string& path) {
  std::string text;
  read_file(path, text);
  return text;
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

// Appends the cells of one part (last axis fastest) to g.
void expand(Grid& g, const Part& part, const std::string& path) {
  size_t total = 1;
  for (const auto& a : part.axes) total *= a.second.size();
  for (size_t i = 0; i < total; ++i) {
    std::vector<std::string> cell = part.fixed;
    size_t rest = i;
    std::vector<std::string> picks(part.axes.size()), extras;
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
        extras.push_back(extra);
      }
      rest /= part.axes[a].second.size();
    }
    picks.insert(picks.end(), extras.begin(), extras.end());
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

Grid load_grid(const std::string& path, bool quick, uint64_t seed_offset) {
  Grid g;
  g.path = path;
  if (!std::ifstream(path)) throw InputError("grid '" + path + "': cannot be read");
  std::vector<CLI::ConfigItem> items;
  try {
    items = CLI::ConfigTOML().from_file(path);
  } catch (const std::exception& e) {
    throw InputError("grid '" + path + "': " + e.what());
  }
  std::vector<std::pair<std::string, std::vector<std::string>>> quick_axes;
  std::vector<Part> parts;
  auto part_named = [&](const std::string& name) -> Part& {
    for (auto& p : parts)
      if (p.name == name) return p;
    parts.push_back({name, {}, {}});
    return parts.back();
  };
  for (const auto& item : items) {
    if (item.name == "++" || item.name == "--") continue;
    std::vector<std::string> parts_of_key = item.parents;
    parts_of_key.push_back(item.name);
    const auto& k = parts_of_key;
    const std::string full = item.fullname();
    auto tail = [&](size_t from) {
      std::string t;
      for (size_t i = from; i < k.size(); ++i) t += (t.empty() ? "" : ".") + k[i];
      return t;
    };
    auto no_values = [&](const std::string& axis) {
      return InputError("grid '" + path + "': axis '" + axis + "' has no values");
    };
    if (k.size() == 1 && k[0] == "config") {
      const std::string dir =
          path.find('/') == std::string::npos ? "." : path.substr(0, path.find_last_of('/'));
      g.base_config =
          item.inputs.at(0).front() == '/' ? item.inputs[0] : dir + "/" + item.inputs[0];
    } else if (k[0] == "set" && k.size() > 1) {
      set_or_replace(g.fixed, tail(1), value_text(item.inputs));
    } else if (k[0] == "axes" && k.size() > 1) {
      if (item.inputs.empty()) throw no_values(tail(1));
      g.axes.emplace_back(tail(1), item.inputs);
    } else if (k[0] == "parts" && k.size() > 3 && (k[2] == "set" || k[2] == "axes")) {
      Part& part = part_named(k[1]);
      if (k[2] == "set") {
        set_or_replace(part.fixed, tail(3), value_text(item.inputs));
      } else {
        if (item.inputs.empty()) throw no_values(k[1] + ": " + tail(3));
        add_axis(part.axes, tail(3), item.inputs);
      }
    } else if (k[0] == "quick" && k.size() > 2 && (k[1] == "set" || k[1] == "axes")) {
      if (!quick) continue;
      if (k[1] == "set")
        set_or_replace(g.fixed, tail(2), value_text(item.inputs));
      else
        quick_axes.emplace_back(tail(2), item.inputs);
    } else {
      throw InputError("grid '" + path + "': unknown key '" + full +
                       "' (a grid has config, [set...], [axes...], [parts.NAME.set/axes...] and "
                       "[quick.set/axes...])");
    }
  }
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
  g.base_config_text = g.base_config.empty() ? "" : read_all(g.base_config);
  std::string identity = g.base_config_text;
  std::map<std::string, size_t> resolved;  // a cell's whole resolved config -> the cell
  for (size_t i = 0; i < g.cells.size(); ++i) {
    try {
      RunConfig cfg = load_config(g.base_config, g.cells[i]);
      if (seed_offset != 0) {  // fresh seeds: every cell's seed moved by the same offset
        if (cfg.seed > UINT64_MAX - seed_offset)
          throw InputError("--seed-offset " + std::to_string(seed_offset) +
                           ": train.seed + offset exceeds 2^64 - 1");
        set_or_replace(g.cells[i], "train.seed", std::to_string(cfg.seed + seed_offset));
        cfg = load_config(g.base_config, g.cells[i]);
      }
      // Two cells that resolve to one run (a repeated axis value, an axis value whose own
      // overrides undo another axis) would count one experiment twice as two seeds' worth.
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
