// Writes what tests/py/test_parity.py needs to rebuild the model in PyTorch: initial weights,
// each step's batch, the first step's loss and gradients, the loss of every training step (with
// train.ranks > 1, each step's gradient from the ranks' shards, as the trainer does) and the
// weights after the last (/final, which `divlab train` must reproduce bit for bit).
//   parity_dump OUT.h5 key=value ...   (the same keys as divlab train's --set)
#include <cstdio>
#include <iostream>

#include "datasets/dataset.h"
#include "experiments/config.h"
#include "experiments/data_parallel.h"
#include "io/trace.h"
#include "model/optimizer.h"

namespace divlab {

template <class T>
std::vector<double> as_double(const T* p, int64_t n) {
  return std::vector<double>(p, p + n);
}

template <class T>
void dump(const RunConfig& cfg, const std::string& out) {
  const ModelConfig& m = cfg.model;
  const int B = cfg.batch, N = B * m.seq_len;
  Transformer<T> model(m, cpu_catalogue<T>().select(cfg.kernels), cfg.model_batch());
  model.init(cfg.seed);
  Optimizer<T> optim(cfg.optim, model.layout(), host_memory());
  DataParallelStep<T, T> step(model, cfg.ranks, cfg.micro_batches);
  DatasetOptions dopt;
  dopt.vocab = m.vocab, dopt.seed = cfg.seed, dopt.verbose = false;
  const auto data = make_dataset(cfg.data, dopt);

  TraceWriter w(out, true);
  w.attr("/", "config_toml", cfg.to_toml());
  using K = TraceWriter::Kind;
  for (const auto& p : model.layout()) {
    w.array("/params/" + p.name, K::Float64, p.size);
    w.array("/grads/" + p.name, K::Float64, p.size);
  }
  w.array("/batches/inputs", K::Int64, cfg.steps * N);
  w.array("/batches/targets", K::Int64, cfg.steps * N);
  w.series("/losses", K::Float64);
  for (const auto& p : model.layout())
    w.write_array("/params/" + p.name, as_double(model.params().data() + p.offset, p.size));
  std::vector<TokenId> in(N), tgt(N);
  std::vector<int64_t> all_in, all_tgt;
  for (int64_t s = 0; s < cfg.steps; ++s) {
    data->batch(s, B, m.seq_len, in.data(), tgt.data());
    all_in.insert(all_in.end(), in.begin(), in.end());
    all_tgt.insert(all_tgt.end(), tgt.begin(), tgt.end());
    w.append("/losses", double(step.run(in.data(), tgt.data(), cfg.seed, s)));
    if (s == 0)
      for (const auto& p : model.layout())
        w.write_array("/grads/" + p.name, as_double(model.grads().data() + p.offset, p.size));
    optim.step(model, s);
  }
  for (const auto& p : model.layout()) {
    w.array("/final/" + p.name, K::Float64, p.size);
    w.write_array("/final/" + p.name, as_double(model.params().data() + p.offset, p.size));
  }
  w.write_array("/batches/inputs", all_in);
  w.write_array("/batches/targets", all_tgt);
  w.publish();  // written whole, then renamed into place
}

}  // namespace divlab

int main(int argc, char** argv) {
  using namespace divlab;
  if (argc < 2) {
    std::cerr << "usage: parity_dump OUT.h5 key=value ...\n";
    return 2;
  }
  try {
    const RunConfig cfg = load_config("", std::vector<std::string>(argv + 2, argv + argc));
    if (cfg.precision == Precision::Fp64)
      dump<double>(cfg, argv[1]);
    else
      dump<float>(cfg, argv[1]);
  } catch (const InputError& e) {
    std::cerr << "parity_dump: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
