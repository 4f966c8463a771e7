// Time to read, tokenize (train BPE) and cache the Brown corpus, then to load it from the cache.
//   bench_tokenize_brown [--vocab 4096]     (needs data/brown: scripts/setup.sh)
// Goal (issue: datasets): < 30 s the first time on 2 cores, < 1 s after.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "datasets/text.h"
#include "experiments/config.h"

using namespace divlab;

int main(int argc, char** argv) {
  CLI::App app{"Brown corpus tokenization benchmark"};
  int vocab = 4096;
  app.add_option("--vocab", vocab);
  CLI11_PARSE(app, argc, argv);
  char dir[] = "/tmp/divlab_bench_cache_XXXXXX";
  const std::string cache = mkdtemp(dir);
  DatasetOptions opt;
  opt.vocab = vocab, opt.seq_len = 64, opt.cache_dir = cache, opt.verbose = false;
  double seconds[2];
  int64_t tokens = 0;
  try {
    for (int run = 0; run < 2; ++run) {
      const auto t0 = std::chrono::steady_clock::now();
      TextDataset d("brown", read_brown_corpus(data_dir() + "/brown"), opt);
      seconds[run] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      tokens = d.train_tokens() + d.validation_tokens();
    }
  } catch (const InputError& e) {
    std::fprintf(stderr, "bench: %s\n", e.what());
    return 2;
  }
  std::filesystem::remove_all(cache);
  std::printf("brown corpus, BPE vocab %d\n%-40s %10s\n", vocab, "measure", "value");
  std::printf("%-40s %10lld\n", "tokens", (long long)tokens);
  std::printf("%-40s %9.2fs\n", "first load (read + train BPE + encode)", seconds[0]);
  std::printf("%-40s %9.2fs\n", "cached load (read + hash + cache)", seconds[1]);
  return 0;
}
