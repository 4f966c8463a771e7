#include "experiments/config.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>
#include <type_traits>

#include "common/files.h"
#include "datasets/dataset.h"
#include "io/toml_reader.h"
#include "kernels/backend.h"
#include "kernels/plugins.h"
#include "kernels/registry.h"
#include "kernels/shadow.h"

namespace divlab {
namespace {

enum class Type { Int, Float, Bool, String, List };
enum class Range { Any, Positive, NonNegative, UnitOpen, UnitClosed };

// A value checked against its key's spec (normalise, below): its canonical TOML text, and the
// value read once from it: the items of a list, the text of a string, the number or boolean.
struct Checked {
  std::string text;
  std::vector<std::string> items;
  long long integer = 0;
  double number = 0;
  bool boolean = false;
};

struct KeySpec;
// Stores a key's checked value in its member.
using Assign = std::function<void(const KeySpec&, RunConfig&, const Checked&)>;

// One row per key: its name, the member it fills, its default and meaning. The member's type
// decides the value's type (integer, number, boolean, string, list) and an enum's choices, so a
// key is spelled once and cannot be read back under another name.
struct KeySpec {
  std::string key;
  Type type;
  std::string fallback;  // default, as text
  std::string doc;
  Range range = Range::Any;
  std::vector<std::string> choices = {};
  Assign assign;
};

// What a member's type means for its key.
template <class M>
constexpr Type type_of() {
  if constexpr (std::is_same_v<M, bool>)
    return Type::Bool;
  else if constexpr (std::is_integral_v<M>)
    return Type::Int;
  else if constexpr (std::is_floating_point_v<M>)
    return Type::Float;
  else if constexpr (std::is_same_v<M, std::vector<std::string>>)
    return Type::List;
  else
    return Type::String;  // std::string or a named enum
}

// Stores a checked value in a member of type M.
template <class M>
void store(const KeySpec& s, M& out, const Checked& c) {
  if constexpr (std::is_same_v<M, std::vector<std::string>>) {
    out = c.items;
  } else {
    const std::string& v = c.items.at(0);
    if constexpr (std::is_same_v<M, bool>) {
      out = c.boolean;
    } else if constexpr (std::is_integral_v<M>) {
      // Held narrower than 64 bits: checked before narrowing, so 2^32 + 64 is refused, not
      // trained as 64.
      if constexpr (sizeof(M) < sizeof(long long))
        if (c.integer > std::numeric_limits<M>::max() || c.integer < std::numeric_limits<M>::min())
          throw InputError("config key '" + s.key + "' = " + v + ": must be at most " +
                           std::to_string(std::numeric_limits<M>::max()));
      out = M(c.integer);  // a 64-bit unsigned member's key is NonNegative, checked before
    } else if constexpr (std::is_floating_point_v<M>) {
      out = c.number;
    } else if constexpr (std::is_same_v<M, std::string>) {
      out = v;
    } else if (!parse_name(v, &out)) {  // a closed set: its names are the choices checked before
      throw std::logic_error("config: '" + s.key + "' escaped its check");
    }
  }
}

// A schema row bound to the member `at` names (a lambda RunConfig& -> member&).
template <class At>
KeySpec key(std::string name, At at, std::string fallback, std::string doc,
            Range range = Range::Any) {
  using M = std::remove_reference_t<decltype(at(std::declval<RunConfig&>()))>;
  KeySpec spec;
  spec.key = std::move(name), spec.type = type_of<M>(), spec.fallback = std::move(fallback);
  spec.doc = std::move(doc), spec.range = range;
  if constexpr (std::is_enum_v<M>) spec.choices = names_of<M>();
  spec.assign = [at](const KeySpec& s, RunConfig& c, const Checked& v) { store(s, at(c), v); };
  return spec;
}
// The member a key fills, e.g. DIVLAB_AT(model.vocab).
#define DIVLAB_AT(member) ([](RunConfig & c) -> auto& { return c.member; })

const std::vector<KeySpec>& schema() {
  static const std::vector<KeySpec> keys = {
      key("backend", DIVLAB_AT(backend), "cpu", "where the run executes"),
      key("data", DIVLAB_AT(data), "uniform",
          "dataset spec: uniform | zipf:S | markov:S,P | text:PATH | brown | english"),
      key("plugins", DIVLAB_AT(plugins), "",
          "shared libraries with candidate kernels (C ABI: kernels/plugin_abi.h)"),
      key("model.vocab", DIVLAB_AT(model.vocab), "256", "vocabulary size V", Range::Positive),
      key("model.d_model", DIVLAB_AT(model.d_model), "64", "residual width C", Range::Positive),
      key("model.n_layers", DIVLAB_AT(model.n_layers), "2", "transformer blocks", Range::Positive),
      key("model.n_heads", DIVLAB_AT(model.n_heads), "4", "attention heads (must divide d_model)",
          Range::Positive),
      key("model.arch", DIVLAB_AT(model.arch), "gpt2",
          "model family: gpt2 (learned positions, GELU MLP) | llama (RoPE, grouped-query "
          "attention, SwiGLU, fused residual add + RMSNorm)"),
      key("model.n_kv_heads", DIVLAB_AT(model.n_kv_heads), "0",
          "llama: key/value heads, dividing n_heads (0 = n_heads)", Range::NonNegative),
      key("model.seq_len", DIVLAB_AT(model.seq_len), "32", "context length T", Range::Positive),
      key("model.mlp_hidden", DIVLAB_AT(model.mlp_hidden), "0",
          "MLP width F (0 = 4 d_model for gpt2; llama: 8 d_model / 3 rounded up to a multiple of "
          "64)",
          Range::NonNegative),
      key("model.rope_base", DIVLAB_AT(model.rope_base), "10000",
          "llama: RoPE frequency base (llama 3: 500000)", Range::Positive),
      key("model.tied_embeddings", DIVLAB_AT(model.tied_embeddings), "false",
          "the LM head is the token embedding (one tensor, wte.weight)"),
      key("model.logit_softcap", DIVLAB_AT(model.logit_softcap), "0",
          "final logits -> cap * tanh(logits / cap), Gemma 2 style (0 = off)", Range::NonNegative),
      key("model.norm_eps", DIVLAB_AT(model.norm_eps), "1e-5", "RMSNorm epsilon", Range::Positive),
      key("model.init_std", DIVLAB_AT(model.init_std), "0.02", "std of the normal weight init",
          Range::Positive),
      key("train.batch", DIVLAB_AT(batch), "8", "sequences per step B", Range::Positive),
      key("train.ranks", DIVLAB_AT(ranks), "1",
          "data-parallel ranks R (dividing train.batch): each takes B / R sequences of every "
          "step, run one after another on this device, and the grad_reduce op averages their "
          "gradients",
          Range::Positive),
      key("train.micro_batches", DIVLAB_AT(micro_batches), "1",
          "gradient accumulation: each rank's B / R sequences run as this many micro-batches, "
          "each adding its gradient into the step's (in place, as llm.c does: a kernel that "
          "accumulates in low precision keeps accumulating, so micro-batches, unlike ranks, do "
          "not divide the dose); the memory of one micro-batch",
          Range::Positive),
      key("train.data_parallel", DIVLAB_AT(data_parallel), "simulated",
          "where the ranks run: simulated (one after another on this device) | nccl (one "
          "process per GPU, backend = \"cuda\") | processes (one process per rank on this "
          "host's CPU, backend = \"cpu\"); divlab starts the processes, or mpirun / srun / "
          "torchrun does: the same numbers every way"),
      key("train.steps", DIVLAB_AT(steps), "100", "optimizer steps", Range::NonNegative),
      key("train.lr", DIVLAB_AT(optim.lr), "0.1", "peak learning rate", Range::Positive),
      key("train.optimizer", DIVLAB_AT(optim.kind), "sgd", "optimizer"),
      key("train.seed", DIVLAB_AT(seed), "0", "seed for init and data", Range::NonNegative),
      key("train.momentum", DIVLAB_AT(optim.momentum), "0", "SGD momentum", Range::UnitOpen),
      key("train.nesterov", DIVLAB_AT(optim.nesterov), "false", "SGD Nesterov momentum"),
      key("train.weight_decay", DIVLAB_AT(optim.weight_decay), "0",
          "L2 (SGD) / decoupled (AdamW) decay", Range::NonNegative),
      key("train.beta1", DIVLAB_AT(optim.beta1), "0.9", "AdamW beta1", Range::UnitOpen),
      key("train.beta2", DIVLAB_AT(optim.beta2), "0.999", "AdamW beta2", Range::UnitOpen),
      key("train.eps", DIVLAB_AT(optim.eps), "1e-8", "AdamW epsilon", Range::Positive),
      key("train.grad_clip", DIVLAB_AT(optim.grad_clip), "0", "global grad-norm clip (0 = off)",
          Range::NonNegative),
      key("train.warmup_steps", DIVLAB_AT(optim.warmup_steps), "0", "linear LR warmup steps",
          Range::NonNegative),
      key("train.schedule", DIVLAB_AT(optim.schedule), "constant", "LR after warmup"),
      key("train.min_lr_ratio", DIVLAB_AT(optim.min_lr_ratio), "0.1",
          "cosine floor as a fraction of lr", Range::UnitClosed),
      key("train.precision", DIVLAB_AT(precision), "fp32",
          "working precision: fp32 | fp64 (cpu) | bf16 (activations stored in bf16; fp32 "
          "accumulation, residual stream and master weights; cuda: bf16 tensor-core GEMMs)"),
      key("train.threads", DIVLAB_AT(threads), "0",
          "CPU threads (0 = OMP_NUM_THREADS if set, else all cores)", Range::NonNegative),
      key("eval.every", DIVLAB_AT(eval_every), "0", "validation loss every K steps (0 = off)",
          Range::NonNegative),
      key("eval.batches", DIVLAB_AT(eval_batches), "4", "validation batches per evaluation",
          Range::Positive),
      key("shadow.every", DIVLAB_AT(shadow_every), "0",
          "shadow-evaluate variants every K steps (0 = off)", Range::NonNegative),
      key("shadow.variants", DIVLAB_AT(shadow_variants), "", "op=variant entries to shadow"),
      key("shadow.reference", DIVLAB_AT(shadow_reference), "auto",
          "what candidates are compared with: fp64 (the op's reference in fp64 on the host, "
          "exact) | fp32_device (cuda: the GPU's fp32 reference kernels, compared on the GPU; "
          "metrics within the fp32 reference's own distance from fp64) | auto (fp32_device on "
          "cuda, fp64 on the cpu)"),
      key("trace.flush_steps", DIVLAB_AT(flush_steps), "10",
          "flush the trace at least every K steps", Range::Positive),
      key("trace.flush_seconds", DIVLAB_AT(flush_seconds), "2", "... and at least every S seconds",
          Range::Positive),
      key("trace.initial_weights", DIVLAB_AT(initial_weights), "false",
          "keep the weights before the first step in /weights/initial (divlab export)"),
      key("trace.final_weights", DIVLAB_AT(final_weights), "false",
          "keep the weights after the last step in /weights/final (divlab export)"),
      key("checkpoint.every", DIVLAB_AT(checkpoint_every), "100",
          "checkpoint weights and optimizer state every K steps, for --resume (0 = never)",
          Range::NonNegative),
      key("debug.sync_kernels", DIVLAB_AT(sync_kernels), "false",
          "cuda: synchronise after every kernel launch and name the kernel that failed (slow)"),
      key("debug.cuda_graphs", DIVLAB_AT(cuda_graphs), "true",
          "cuda: replay each step of a reference run from a CUDA graph (the same kernels, one "
          "launch); false: launch op by op"),
      key("debug.abort_at_step", DIVLAB_AT(abort_at_step), "-1",
          "abort the process at this step (tests of crash handling; -1 = never)"),
  };
  return keys;
}
#undef DIVLAB_AT

const std::string kKernelsPrefix = "kernels.";

std::string type_name(Type t) {
  switch (t) {
    case Type::Int:
      return "integer";
    case Type::Float:
      return "number";
    case Type::Bool:
      return "boolean";
    case Type::String:
      return "string";
    case Type::List:
      return "list";
  }
  return "?";
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

// Levenshtein distance, for "did you mean" hints.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1])});
      diag = up;
    }
  }
  return row[b.size()];
}

const KeySpec* find_spec(const std::string& key) {
  for (const auto& s : schema())
    if (s.key == key) return &s;
  return nullptr;
}

[[noreturn]] void unknown_key(const std::string& key, const std::string& where) {
  std::vector<std::string> keys;
  for (const auto& s : schema()) keys.push_back(s.key);
  const std::string best = closest_name(key, keys);
  throw InputError("unknown config key '" + key + "'" + where +
                   (best.empty() ? "" : "; did you mean '" + best + "'?") +
                   " (divlab train --help-config lists every key)");
}

// Values as read, type-checked against the schema: key -> canonical texts (one for a scalar, any
// count for a list) and where they came from, for messages.
struct RawValue {
  std::vector<std::string> values;
  std::string where;  // " (c.toml line 4)" or " (--set)"
};
using RawValues = std::map<std::string, RawValue>;

[[noreturn]] void wrong_type(const std::string& key, const std::string& where,
                             const std::string& expected, const TomlValue& got) {
  throw InputError("config key '" + key + "'" + where + ": expected " + expected + ", got " +
                   got.describe());
}

// A value's text if it has the schema's type. A file's values must have it exactly; on the
// command line any scalar is a string's text (`data=zipf:1.1`, `kernels.x=v1` need no quotes),
// and a bare word where a number belongs is named as typed.
std::string scalar_text(const std::string& key, Type type, const TomlValue& v,
                        const std::string& where, bool command_line) {
  using Kind = TomlValue::Kind;
  switch (type) {
    case Type::Int:
      if (v.kind != Kind::Integer) wrong_type(key, where, "an integer", v);
      break;
    case Type::Float:
      if (v.kind != Kind::Integer && v.kind != Kind::Float) wrong_type(key, where, "a number", v);
      break;
    case Type::Bool:
      if (v.kind != Kind::Boolean) wrong_type(key, where, "true or false", v);
      break;
    default:
      if (v.kind == Kind::Array) wrong_type(key, where, "a string", v);
      if (v.kind != Kind::String && !command_line) wrong_type(key, where, "a string", v);
      break;
  }
  return v.text;
}

void put(RawValues& raw, const std::string& key, const TomlValue& v, const std::string& where,
         bool command_line) {
  const KeySpec* spec = find_spec(key);
  const bool kernel_key = key.rfind(kKernelsPrefix, 0) == 0 && key.size() > kKernelsPrefix.size();
  if (!spec && !kernel_key) unknown_key(key, where);
  raw.erase(key);  // a file cannot repeat a key (toml++ refuses it); on --set the last one wins
  const Type type = spec ? spec->type : Type::String;
  RawValue& out = raw[key];
  out.where = where;
  if (type != Type::List) {
    out.values = {scalar_text(key, type, v, where, command_line)};
    return;
  }
  if (v.kind != TomlValue::Kind::Array) {
    if (!command_line) wrong_type(key, where, "a list of strings", v);
    if (!v.text.empty()) out.values = {v.text};  // --set plugins=a.so
    return;
  }
  for (const TomlValue& item : v.items)
    out.values.push_back(scalar_text(key, Type::String, item, where, command_line));
}

long long parse_int(const std::string& key, const std::string& v, const std::string& where) {
  try {
    size_t used = 0;
    const long long x = std::stoll(v, &used);
    if (used == v.size()) return x;
  } catch (const std::exception&) {
  }
  throw InputError("config key '" + key + "'" + where + ": expected an integer, got '" + v + "'");
}

double parse_float(const std::string& key, const std::string& v, const std::string& where) {
  try {
    size_t used = 0;
    const double x = std::stod(v, &used);
    if (used == v.size() && std::isfinite(x)) return x;
  } catch (const std::exception&) {
  }
  throw InputError("config key '" + key + "'" + where + ": expected a finite number, got '" + v +
                   "'");
}

bool parse_bool(const std::string& key, const std::string& v, const std::string& where) {
  if (v == "true") return true;
  if (v == "false") return false;
  throw InputError("config key '" + key + "'" + where + ": expected true or false, got '" + v +
                   "'");
}

void check_range(const KeySpec& s, double x, const std::string& text, const std::string& where) {
  const char* need = nullptr;
  switch (s.range) {
    case Range::Any:
      return;
    case Range::Positive:
      need = x > 0 ? nullptr : "> 0";
      break;
    case Range::NonNegative:
      need = x >= 0 ? nullptr : ">= 0";
      break;
    case Range::UnitOpen:
      need = x >= 0 && x < 1 ? nullptr : "in [0, 1)";
      break;
    case Range::UnitClosed:
      need = x >= 0 && x <= 1 ? nullptr : "in [0, 1]";
      break;
  }
  if (need) throw InputError("config key '" + s.key + "' = " + text + where + ": must be " + need);
}

// Checks a raw value against its spec: reads it once, and gives its canonical TOML text.
Checked normalise(const KeySpec& s, const std::vector<std::string>& values,
                  const std::string& where) {
  Checked c;
  c.items = values;
  if (s.type == Type::List) {
    c.text = "[";
    for (size_t i = 0; i < values.size(); ++i) {
      TomlValue item;
      item.text = values[i];
      c.text += (i ? ", " : "") + item.toml();
    }
    c.text += "]";
    return c;
  }
  const std::string& v = values.at(0);
  switch (s.type) {
    case Type::Int:  // canonical text, so that two spellings of one value resolve to one run
      c.integer = parse_int(s.key, v, where);
      check_range(s, double(c.integer), v, where);
      c.text = std::to_string(c.integer);
      return c;
    case Type::Float:
      c.number = parse_float(s.key, v, where);
      check_range(s, c.number, v, where);
      c.text = float_text(c.number);
      return c;
    case Type::Bool:
      c.boolean = parse_bool(s.key, v, where);
      c.text = v;
      return c;
    default:
      break;
  }
  if (!s.choices.empty() && std::find(s.choices.begin(), s.choices.end(), v) == s.choices.end()) {
    std::string valid;
    for (const auto& c : s.choices) valid += (valid.empty() ? "" : ", ") + c;
    throw InputError("config key '" + s.key + "' = '" + v + "'" + where + ": must be one of " +
                     valid);
  }
  if (v.empty()) throw InputError("config key '" + s.key + "'" + where + ": must not be empty");
  TomlValue text;
  text.text = v;
  c.text = text.toml();
  return c;
}

}  // namespace

std::string describe_config_keys() {
  std::ostringstream out;
  for (const auto& s : schema()) {
    // A closed set's choices, unless its description already names each of them.
    std::string choices;
    bool all_named = true;
    for (const auto& c : s.choices) {
      choices += (choices.empty() ? "" : " | ") + c;
      all_named = all_named && s.doc.find(c) != std::string::npos;
    }
    out << "  " << s.key << " (" << type_name(s.type) << ", default "
        << (s.fallback.empty() ? "[]" : s.fallback) << "): " << s.doc
        << (all_named ? "" : ": " + choices) << "\n";
  }
  out << "  kernels.<op> (string, default reference): variant for that op (divlab kernels)\n";
  return out.str();
}

RunConfig parse_config(const std::string& path, const std::vector<std::string>& overrides) {
  if (path.empty()) return parse_config_text("", "", overrides);
  const std::string text = read_input_file(path, "config file");
  return parse_config_text(text, path, overrides);
}

RunConfig parse_config_text(const std::string& toml, const std::string& source,
                            const std::vector<std::string>& overrides, ConfigFrom from) {
  RawValues raw;
  if (!toml.empty()) {
    const std::string named = from == ConfigFrom::Trace ? "trace '" + source + "'" : source;
    for (const TomlEntry& e :
         read_toml(toml, from == ConfigFrom::Trace ? named : "config file '" + source + "'"))
      put(raw, e.key, e.value, " (" + named + " line " + std::to_string(e.value.line) + ")", false);
  }
  for (const auto& o : overrides) {
    const auto eq = o.find('=');
    if (eq == std::string::npos || eq == 0)
      throw InputError("--set '" + o + "': expected key=value");
    TomlValue value;
    try {
      value = read_toml_value(o.substr(eq + 1));
    } catch (const InputError& e) {
      throw InputError("--set '" + o + "': " + e.what());
    }
    put(raw, trim(o.substr(0, eq)), value, " (--set)", true);
  }

  RunConfig cfg;
  for (const auto& s : schema()) {
    const auto it = raw.find(s.key);
    const std::vector<std::string> values = it != raw.end() ? it->second.values
                                            : s.type == Type::List
                                                ? std::vector<std::string>{}
                                                : std::vector<std::string>{s.fallback};
    const Checked checked = normalise(s, values, it != raw.end() ? it->second.where : "");
    s.assign(s, cfg, checked);
    cfg.resolved.emplace_back(s.key, checked.text);
  }
  for (const auto& [key, value] : raw)
    if (key.rfind(kKernelsPrefix, 0) == 0) {
      TomlValue name;
      name.text = value.values.at(0);
      cfg.kernels[key.substr(kKernelsPrefix.size())] = name.text;
      cfg.resolved.emplace_back(key, name.toml());
    }
  const ModelConfig& m = cfg.model;
  OptimConfig& o = cfg.optim;
  o.total_steps = cfg.steps;

  parse_dataset_spec(cfg.data);  // its syntax and numbers; the corpus is checked before a run
  if (cfg.threads > kMaxThreads)
    throw InputError("config key 'train.threads' = " + std::to_string(cfg.threads) + ": at most " +
                     std::to_string(kMaxThreads));
  // Cross-key rules.
  if (m.vocab < 2)
    throw InputError("config key 'model.vocab' = " + std::to_string(m.vocab) + ": must be >= 2");
  if (m.d_model % m.n_heads != 0)
    throw InputError("config key 'model.d_model' = " + std::to_string(m.d_model) +
                     " is not divisible by 'model.n_heads' = " + std::to_string(m.n_heads));
  if (m.kv_heads() > m.n_heads || m.n_heads % m.kv_heads() != 0)
    throw InputError("config key 'model.n_kv_heads' = " + std::to_string(m.n_kv_heads) +
                     " does not divide 'model.n_heads' = " + std::to_string(m.n_heads));
  if (!m.llama() && m.kv_heads() != m.n_heads)
    throw InputError("config key 'model.n_kv_heads' = " + std::to_string(m.n_kv_heads) +
                     ": grouped-query attention needs 'model.arch' = \"llama\"");
  if (!m.llama() && m.rope_base != 10000)
    throw InputError(
        "config key 'model.rope_base': RoPE needs 'model.arch' = \"llama\" (gpt2 "
        "learns its positions)");
  if (m.llama() && m.head_dim() % 2 != 0)
    throw InputError("config: 'model.d_model' / 'model.n_heads' = " + std::to_string(m.head_dim()) +
                     " is odd; RoPE rotates channel pairs (llama needs an even head size)");
  if (cfg.batch % cfg.ranks != 0)
    throw InputError("config key 'train.ranks' = " + std::to_string(cfg.ranks) +
                     " does not divide 'train.batch' = " + std::to_string(cfg.batch) +
                     " (every rank takes an equal shard of the batch)");
  if (cfg.batch % (int64_t(cfg.ranks) * cfg.micro_batches) != 0)
    throw InputError("config key 'train.micro_batches' = " + std::to_string(cfg.micro_batches) +
                     " does not divide the " + std::to_string(cfg.batch / cfg.ranks) +
                     " sequences of a rank's shard ('train.batch' / 'train.ranks')");
  if (cfg.data_parallel == RankTransport::Nccl && cfg.backend != Backend::Cuda)
    throw InputError(
        "config key 'train.data_parallel' = \"nccl\" needs 'backend' = \"cuda\" (one GPU "
        "per rank)");
  if (cfg.data_parallel == RankTransport::Processes && cfg.backend != Backend::Cpu)
    throw InputError(
        "config key 'train.data_parallel' = \"processes\" needs 'backend' = \"cpu\" (on GPUs: "
        "\"nccl\")");
  if (ranks_are_processes(cfg.data_parallel) && cfg.ranks < 2)
    throw InputError("config key 'train.data_parallel' = \"" +
                     std::string(name_of(cfg.data_parallel)) + "\" needs 'train.ranks' >= 2 (" +
                     std::to_string(cfg.ranks) + " given: one process per rank)");
  if (o.nesterov && o.momentum == 0)
    throw InputError("config key 'train.nesterov' = true needs 'train.momentum' > 0");
  // Sizes in floating point first: the int64 products below and in every allocation are then
  // known not to overflow. 2^40 parameters is far beyond any machine's memory; the memory
  // prediction (per backend, before allocating) refuses what does not fit this one.
  const double C = m.d_model,
               F = m.mlp_hidden > 0 ? m.mlp_hidden
                   : m.llama()      ? std::ceil(std::floor(8 * C / 3) / 64) * 64
                                    : 4 * C,
               F_in = m.llama() ? 2 * F : F,
               params = (2.0 * m.vocab + m.seq_len) * C +
                        double(m.n_layers) * (4 * C * C + 3 * C * F + 2 * C) + C;
  if (params > std::ldexp(1.0, 40)) {
    char count[32];
    std::snprintf(count, sizeof count, "%.3g", params);
    throw InputError("config: model.vocab, model.d_model, model.n_layers and model.seq_len give " +
                     std::string(count) + " parameters (at most 2^40)");
  }
  // A step's positions, and the widest activation of the batch the model holds (logits, the
  // MLP's input or q, k and v), are indexed with 32 bits.
  if (int64_t(cfg.batch) * m.seq_len >= (int64_t(1) << 31))
    throw InputError(
        "config: train.batch * model.seq_len = " + std::to_string(int64_t(cfg.batch) * m.seq_len) +
        " positions in a step (at most 2^31 - 1)");
  const int64_t tokens = int64_t(cfg.model_batch()) * m.seq_len;
  const double width = std::max({double(m.vocab), F_in, 3 * C});
  if (double(tokens) * width > std::ldexp(1.0, 31)) {
    const std::string widest =
        width == m.vocab ? "model.vocab = " + std::to_string(m.vocab)
                         : "a width of " + std::to_string(int64_t(width)) +
                               " (from model.d_model = " + std::to_string(m.d_model) + ")";
    char count[32];
    std::snprintf(count, sizeof count, "%.3g", double(tokens) * width);
    const std::string held = cfg.ranks * cfg.micro_batches > 1
                                 ? "the model's batch (train.batch / (train.ranks * "
                                   "train.micro_batches)) * model.seq_len = "
                                 : "train.batch * model.seq_len = ";
    throw InputError("config: " + held + std::to_string(tokens) + " positions times " + widest +
                     " give an activation of " + count + " elements (at most 2^31)");
  }
  if (cfg.shadow_every > 0 && cfg.shadow_variants.empty())
    throw InputError("config key 'shadow.every' = " + std::to_string(cfg.shadow_every) +
                     " needs 'shadow.variants' (op=variant entries)");
  if (cfg.shadow_reference == ShadowReference::Fp32Device && cfg.backend != Backend::Cuda)
    throw InputError(
        "config key 'shadow.reference' = \"fp32_device\" needs 'backend' = \"cuda\" (on the "
        "cpu the reference is fp64)");
  // A kernel the model never calls would label the run with a variant that never ran.
  const auto never_called = [&](const std::string& op_text, std::string* why) {
    Op op{};
    if (!parse_op(op_text, &op)) return false;
    if (op == Op::sgd_step || op == Op::adamw_step) {
      const OptimizerKind serves = op == Op::sgd_step ? OptimizerKind::Sgd : OptimizerKind::AdamW;
      *why = std::string("train.optimizer is ") + name_of(cfg.optim.kind) + " (" + op_text +
             " updates " + name_of(serves) + " runs)";
      return cfg.optim.kind != serves;
    }
    if (model_calls(m, op)) return false;
    if (op == Op::grad_reduce) {
      *why = "train.ranks is 1 (no data-parallel shards to reduce)";
      return cfg.ranks == 1;
    }
    if (op == Op::softcap_forward || op == Op::softcap_backward)
      *why = "model.logit_softcap is 0 (no soft-cap)";
    else if ((op == Op::gqa_forward || op == Op::gqa_backward) && m.llama())
      *why = "model.n_kv_heads leaves every query head its own key/value head";
    else
      *why = std::string("a model.arch = \"") + name_of(m.arch) + "\" model never calls it";
    return true;
  };
  std::string why;
  for (const auto& [op, variant] : cfg.kernels)
    if (variant != "reference" && never_called(op, &why))
      throw InputError("config key 'kernels." + op + "' = '" + variant + "' never runs: " + why);
  for (const auto& entry : cfg.shadow_variants)
    if (never_called(entry.substr(0, entry.find('=')), &why))
      throw InputError("config key 'shadow.variants': '" + entry + "' never runs: " + why);
  return cfg;
}

void resolve_kernels(const RunConfig& cfg) {
  // Plug-ins first: their variants are valid kernel names from here on.
  try {
    load_plugins(cfg.plugins);
  } catch (const PluginError& e) {
    throw InputError(std::string("config key 'plugins': ") + e.what());
  }
  // Kernel names are checked against the backend's own catalogue. A cuda configuration read by
  // a build without CUDA (e.g. analysing GPU traces on a laptop) is checked against the CPU's
  // names; running it fails later with its own message.
  const bool checkable = cfg.backend == Backend::Cpu || cuda_built();
  try {
    const auto validate = [&](const auto& cat) {
      if (checkable || cfg.kernels.empty()) cat.select(cfg.kernels);
      parse_shadow_specs(cfg.shadow_variants, cat);
    };
    if (cfg.precision == Precision::Fp64) backend_catalogue<double>(cfg.backend, cfg.precision);
    if (checkable)
      with_backend_catalogue(cfg.backend, cfg.precision, validate);
    else
      validate(cpu_catalogue<float>());
  } catch (const UnknownKernel& e) {
    throw InputError(std::string("config key ") + e.what());
  } catch (const BackendError& e) {
    throw InputError(std::string("config: ") + e.what());
  }
}

RunConfig load_config(const std::string& path, const std::vector<std::string>& overrides) {
  RunConfig cfg = parse_config(path, overrides);
  resolve_kernels(cfg);
  return cfg;
}

RunConfig load_config_text(const std::string& toml, const std::string& source,
                           const std::vector<std::string>& overrides, ConfigFrom from) {
  RunConfig cfg = parse_config_text(toml, source, overrides, from);
  resolve_kernels(cfg);
  return cfg;
}

std::string RunConfig::to_toml() const {
  std::ostringstream out;
  std::string section;
  for (const auto& [key, value] : resolved) {
    const auto dot = key.find('.');
    const std::string sec = dot == std::string::npos ? "" : key.substr(0, dot);
    if (sec != section) out << "\n[" << sec << "]\n", section = sec;
    out << (dot == std::string::npos ? key : key.substr(dot + 1)) << " = " << value << "\n";
  }
  return out.str();
}

std::string closest_name(const std::string& word, const std::vector<std::string>& names) {
  std::string best;
  size_t best_distance = 4;  // farther than 3 edits is no longer a typo
  for (const auto& name : names) {
    const size_t d = edit_distance(word, name);
    if (d < best_distance) best_distance = d, best = name;
  }
  return best;
}

}  // namespace divlab
