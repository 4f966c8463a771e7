#include "experiments/sample.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <set>
#include <sstream>

#include "common/errors.h"
#include "common/rng.h"
#include "common/utf8.h"
#include "datasets/synthetic.h"
#include "datasets/text.h"
#include "experiments/config.h"
#include "experiments/weights.h"
#include "io/toml_reader.h"
#include "io/trace.h"
#include "kernels/registry.h"
#include "model/transformer.h"

namespace divlab {

namespace {

struct SampledWeights {
  std::vector<double> params;
  std::string what;
};

// The asked-for weights; the final ones fall back to the newest checkpoint (a sweep cell keeps
// no final weights unless asked).
SampledWeights weights_of(const TraceReader& r, WhichWeights which, const ModelConfig& m,
                          const std::string& path) {
  const auto layout = param_layout(m);
  auto newest_checkpoint = [&](const char* note) -> std::optional<SampledWeights> {
    auto c = trace_weights(r, WhichWeights::Checkpoint, layout);
    if (!c) return std::nullopt;
    return SampledWeights{
        std::move(c->params),
        "the newest checkpoint (after " + std::to_string(c->step) + " steps" + note + ")"};
  };
  if (which == WhichWeights::Checkpoint) {
    if (auto c = newest_checkpoint("")) return std::move(*c);
    throw InputError(no_checkpoint_message(r, path));
  }
  if (auto w = trace_weights(r, which, layout))
    return {std::move(w->params),
            std::string(name_of(which)) + " weights (after " + std::to_string(w->step) + " steps)"};
  if (which == WhichWeights::Initial)
    throw InputError("trace '" + path + "': holds no initial weights (trace.initial_weights)");
  if (auto c = newest_checkpoint("; the trace keeps no final weights")) return std::move(*c);
  throw InputError("trace '" + path + "': holds no weights to sample from (train with --set " +
                   "trace.final_weights=true, or checkpoint.every > 0)");
}

std::vector<int> prompt_ids(const std::string& prompt, const std::string& tokenizer, int vocab) {
  if (const size_t bad = first_invalid_utf8(prompt); bad != std::string::npos)
    throw InputError("--prompt: not UTF-8 text (byte " + std::to_string(bad) + ")" +
                     (tokenizer.empty() ? "" : ": the tokenizer would read it as unknown pieces"));
  if (!tokenizer.empty())
    return prompt.empty() ? std::vector<int>{} : bpe_encode(tokenizer, prompt);
  std::vector<int> ids;
  std::istringstream words(prompt);
  for (std::string w; words >> w;) {
    size_t used = 0;
    long long id = -1;
    try {
      id = std::stoll(w, &used);
    } catch (const std::exception&) {
    }
    if (used != w.size() || id < 0 || id >= vocab)
      throw InputError("--prompt: '" + w + "' is not a token id in 0.." +
                       std::to_string(vocab - 1) + " (this run's data has no tokenizer)");
    ids.push_back(int(id));
  }
  return ids;
}

// Whether `op` writes something the sampled text depends on: the forward ops up to the logits.
// The rest never run at inference, or (the cross-entropy's loss) run on nothing the sampler reads;
// a text labelled with one of them would credit it with a text it did not write.
bool shapes_the_text(Op op) {
  switch (op) {
    case Op::embedding_forward:
    case Op::rmsnorm_forward:
    case Op::linear_forward:
    case Op::attention_forward:
    case Op::gelu_forward:
    case Op::add:
    case Op::rope_forward:
    case Op::gqa_forward:
    case Op::swiglu_forward:
    case Op::softcap_forward:
    case Op::add_rmsnorm_forward:
      return true;
    case Op::rmsnorm_backward:
    case Op::linear_backward:
    case Op::attention_backward:
    case Op::gelu_backward:
    case Op::cross_entropy:
    case Op::embed_rmsnorm_backward:
    case Op::rope_backward:
    case Op::gqa_backward:
    case Op::swiglu_backward:
    case Op::softcap_backward:
    case Op::grad_reduce:
    case Op::sgd_step:
    case Op::adamw_step:
    case Op::cast:
    case Op::sum_squares:
    case Op::count:
      return false;
  }
  return false;
}

}  // namespace

Sample sample(const SampleOptions& opt) {
  if (opt.tokens < 1 || opt.tokens > 100000)
    throw InputError("--tokens " + std::to_string(opt.tokens) + ": must be in 1..100000");
  if (!(opt.temperature >= 0) || !std::isfinite(opt.temperature))
    throw InputError("--temperature: must be a finite number >= 0");
  const TraceReader r(opt.trace);
  // The run's model and data, with the inference kernels in place of the run's (CPU, fp32;
  // the run's plug-ins are not needed, its kernels are replaced before they are looked up).
  const std::string recorded = r.string_attr("/", "config_toml");
  std::vector<std::string> overrides = {"backend=cpu", "train.precision=fp32", "plugins=[]",
                                        "shadow.every=0", "shadow.variants=[]"};
  for (const TomlEntry& e : read_toml(recorded, "trace '" + opt.trace + "'"))
    if (e.key.rfind("kernels.", 0) == 0) overrides.push_back(e.key + "=reference");
  std::set<std::string> named;
  for (const auto& k : opt.kernels) {
    const size_t eq = k.find('=');
    if (eq == std::string::npos) throw InputError("--kernels '" + k + "': expected op=variant");
    if (!named.insert(k.substr(0, eq)).second)
      throw InputError("--kernels: op '" + k.substr(0, eq) + "' named twice");
    if (Op op{}; parse_op(k.substr(0, eq), &op) && !shapes_the_text(op))
      throw InputError("--kernels '" + k + "': " + op_name(op) +
                       " never writes what sampling reads (it runs the forward pass to the "
                       "logits); the text would name a kernel that did not shape it");
    overrides.push_back("kernels." + k);
  }
  RunConfig cfg;
  try {
    cfg = load_config_text(recorded, opt.trace, overrides, ConfigFrom::Trace);
  } catch (const InputError& e) {
    // The recorded config loaded once already; what fails now is an inference kernel named here.
    if (opt.kernels.empty()) throw;
    throw InputError(std::string("--kernels: ") + e.what());
  }
  const ModelConfig& m = cfg.model;
  SampledWeights w = weights_of(r, opt.weights, m, opt.trace);
  const std::string tokenizer =
      r.exists("/dataset/tokenizer_model") ? r.blob("/dataset/tokenizer_model") : "";
  std::vector<int> context = prompt_ids(opt.prompt, tokenizer, m.vocab);
  // A prompt of no tokens (empty, or only spaces between token ids) starts from token 0, which
  // is no part of the text.
  const bool from_token_0 = context.empty();
  if (from_token_0) context.push_back(0);

  Transformer<float> model(m, cpu_catalogue<float>().select(cfg.kernels), 1);
  model.params().assign(w.params);
  const int T = m.seq_len, V = m.vocab;
  std::vector<TokenId> in(T, 0), tgt(T, 0);
  Rng rng(opt.seed, /*stream=*/0x5a3b1e);
  Sample out;
  out.weights = w.what;
  std::vector<double> p(V);
  for (int i = 0; i < opt.tokens; ++i) {
    // The last T tokens; attention is causal, so the positions after them do not matter.
    const int n = std::min<int>(T, int(context.size()));
    std::fill(in.begin(), in.end(), TokenId(0));
    std::copy(context.end() - n, context.end(), in.begin());
    model.forward(in.data(), tgt.data(), false);
    const std::vector<float> logits = model.logits().to_vector();
    const float* row = logits.data() + int64_t(n - 1) * V;
    int next = int(std::max_element(row, row + V) - row);
    if (opt.temperature > 0) {
      double total = 0;
      for (int v = 0; v < V; ++v)
        total += p[v] = std::exp((double(row[v]) - double(row[next])) / opt.temperature);
      double u = rng.uniform() * total;
      for (int v = 0; v < V; ++v)
        if ((u -= p[v]) <= 0 || v == V - 1) {
          next = v;
          break;
        }
    }
    context.push_back(next);
    out.tokens.push_back(next);
  }
  if (cfg.data.rfind("markov:", 0) == 0) {
    DatasetOptions dopt;
    dopt.vocab = m.vocab, dopt.seq_len = m.seq_len, dopt.seed = cfg.seed;
    const auto data = make_dataset(cfg.data, dopt);
    if (const auto* chain = dynamic_cast<const SyntheticDataset*>(data.get())) {
      int follows = 0;
      const size_t first = context.size() - out.tokens.size();  // the first generated token
      for (size_t i = first; i < context.size(); ++i)
        follows += context[i] == chain->successor(TokenId(context[i - 1]));
      out.follows_chain = double(follows) / double(out.tokens.size());
      out.chain_follow_p = chain->follow_p();
    }
  }
  // The prompt and its continuation decoded together: a piece's leading space survives only
  // inside a sequence.
  if (from_token_0) context.erase(context.begin());
  if (!tokenizer.empty()) {
    out.text = bpe_decode(tokenizer, context);
  } else {
    for (size_t i = 0; i < context.size(); ++i)
      out.text += (i ? " " : "") + std::to_string(context[i]);
  }
  return out;
}

}  // namespace divlab
