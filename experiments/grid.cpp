#include "experiments/grid.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <fstream>
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

Grid load_grid(const std::string& path, bool quick) {
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
  for (const auto& item : items) {
    if (item.name == "++" || item.name == "--") continue;
    std::vector<std::string> parts = item.parents;
    parts.push_back(item.name);
    const std::string full = item.fullname();
    auto tail = [&](size_t from) {
      std::string k;
      for (size_t i = from; i < parts.size(); ++i) k += (k.empty() ? "" : ".") + parts[i];
      return k;
    };
    if (parts.size() == 1 && parts[0] == "config") {
      const std::string dir =
          path.find('/') == std::string::npos ? "." : path.substr(0, path.find_last_of('/'));
      g.base_config =
          item.inputs.at(0).front() == '/' ? item.inputs[0] : dir + "/" + item.inputs[0];
    } else if (parts[0] == "set" && parts.size() > 1) {
      set_or_replace(g.fixed, tail(1), value_text(item.inputs));
    } else if (parts[0] == "axes" && parts.size() > 1) {
      if (item.inputs.empty())
        throw InputError("grid '" + path + "': axis '" + tail(1) + "' has no values");
      g.axes.emplace_back(tail(1), item.inputs);
    } else if (parts[0] == "quick" && parts.size() > 2 &&
               (parts[1] == "set" || parts[1] == "axes")) {
      if (!quick) continue;
      if (parts[1] == "set")
        set_or_replace(g.fixed, tail(2), value_text(item.inputs));
      else
        quick_axes.emplace_back(tail(2), item.inputs);
    } else {
      throw InputError("grid '" + path + "': unknown key '" + full +
                       "' (a grid has config, [set...], [axes...] and [quick.set/axes...])");
    }
  }
  for (const auto& [key, values] : quick_axes) {
    bool replaced = false;
    for (auto& a : g.axes)
      if (a.first == key) a.second = values, replaced = true;
    if (!replaced) g.axes.emplace_back(key, values);
  }
  if (g.axes.empty()) throw InputError("grid '" + path + "': no [axes] (nothing to sweep)");
  // Cartesian product, last axis fastest.
  size_t total = 1;
  for (const auto& a : g.axes) total *= a.second.size();
  for (size_t i = 0; i < total; ++i) {
    std::vector<std::string> cell = g.fixed;
    size_t rest = i;
    std::vector<std::string> picks(g.axes.size()), extras;
    for (size_t a = g.axes.size(); a-- > 0;) {
      // "adamw train.lr=3e-3": the value, then overrides that come with it.
      std::istringstream words(g.axes[a].second[rest % g.axes[a].second.size()]);
      std::string value, extra;
      words >> value;
      picks[a] = g.axes[a].first + "=" + value;
      while (words >> extra) {
        if (extra.find('=') == std::string::npos)
          throw InputError("grid '" + path + "': axis '" + g.axes[a].first + "' value '" +
                           words.str() + "': words after the value must be key=value");
        extras.push_back(extra);
      }
      rest /= g.axes[a].second.size();
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
    std::string label;
    for (const auto& p : picks) label += (label.empty() ? "" : " ") + p;
    g.labels.push_back(label);
    g.cells.push_back(cell);
  }
  // Every cell must be a valid run: bad keys and values are reported before anything runs.
  std::string identity = g.base_config.empty() ? "" : read_all(g.base_config);
  for (size_t i = 0; i < g.cells.size(); ++i) {
    try {
      load_config(g.base_config, g.cells[i]);
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
