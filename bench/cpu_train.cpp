// CPU speed of `divlab train` against this machine's Eigen GEMM rate, measured in the same run.
//
//   bench_cpu_train [--config configs/tiny.toml] [--steps 60] [--set key=value ...]
//
// 1. GEMM baseline: Eigen's own (multithreaded) float GEMM at each of the model's matrix shapes,
//    weighted by how many FLOPs the model spends at that shape.
// 2. Training: the real train() path (trace writing included) on the config; steady-state
//    tokens/s from the trace's wall_s, skipping the first steps.
// 3. Model FLOP/s (6 x matmul params + attention, per token) as a fraction of the GEMM rate.
// 4. The same run with shadow mode at every step (shadow.every=1, the seed bug shadowed on the
//    embedding op): its cost as a fraction of step time.
// Step times are medians over the steps after the first few: this machine is shared and noisy.
#include <omp.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <Eigen/Dense>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "experiments/config.h"
#include "experiments/train.h"
#include "io/trace.h"

using namespace divlab;

namespace {

// Median seconds per step of `divlab train` on cfg (trace writing included).
double median_step_seconds(const RunConfig& cfg) {
  char path[] = "/tmp/divlab_bench_XXXXXX.h5";
  close(mkstemps(path, 3));
  TrainOptions opt;
  opt.out = path, opt.force = true, opt.progress = false;
  train(cfg, opt);
  const auto wall = TraceReader(path).floats("/metrics/wall_s");
  unlink(path);
  std::vector<double> steps;
  for (size_t i = std::min<size_t>(5, wall.size() / 4); i < wall.size(); ++i)
    steps.push_back(wall[i] - (i ? wall[i - 1] : 0.0));
  std::nth_element(steps.begin(), steps.begin() + steps.size() / 2, steps.end());
  return steps[steps.size() / 2];
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// GFLOP/s of Y = X W^T for X [n, k], W [m, k] using Eigen's own threading.
double eigen_gemm_gflops(int n, int k, int m) {
  using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const Mat X = Mat::Random(n, k), W = Mat::Random(m, k);
  Mat Y(n, m);
  Y.noalias() = X * W.transpose();  // warm up
  int reps = 0;
  const auto t0 = std::chrono::steady_clock::now();
  do {
    Y.noalias() = X * W.transpose();
    ++reps;
  } while (seconds_since(t0) < 0.3);
  return 2.0 * n * k * m * reps / seconds_since(t0) / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"CPU training throughput vs Eigen GEMM"};
  std::string config = "configs/tiny.toml";
  std::vector<std::string> sets;
  int64_t steps = 60;
  app.add_option("--config", config);
  app.add_option("--set", sets)->allow_extra_args();
  app.add_option("--steps", steps);
  CLI11_PARSE(app, argc, argv);

  std::vector<std::string> overrides = sets;
  overrides.push_back("train.steps=" + std::to_string(steps));
  overrides.push_back("eval.every=0");
  RunConfig cfg;
  try {
    cfg = load_config(config, overrides);
  } catch (const InputError& e) {
    std::fprintf(stderr, "bench: %s\n", e.what());
    return 2;
  }
  const ModelConfig& m = cfg.model;
  const int threads = cfg.threads > 0 ? cfg.threads : default_threads();
  const int64_t N = int64_t(cfg.batch) * m.seq_len, C = m.d_model, V = m.vocab, L = m.n_layers;

  // The model's GEMM shapes: (k, m) pairs with their per-layer multiplicity.
  struct Shape {
    const char* what;
    int64_t k, m, count;
  };
  const std::vector<Shape> shapes = {{"qkv", C, 3 * C, L},
                                     {"attn proj", C, C, L},
                                     {"mlp fc", C, 4 * C, L},
                                     {"mlp proj", 4 * C, C, L},
                                     {"lm head", C, V, 1}};
  Eigen::setNbThreads(threads);
  double weighted_time = 0, total_flops = 0;
  std::printf("%-10s %8s %8s %8s %10s\n", "gemm", "n", "k", "m", "GFLOP/s");
  for (const auto& s : shapes) {
    const double g = eigen_gemm_gflops(int(N), int(s.k), int(s.m));
    const double flops = 2.0 * N * s.k * s.m * s.count;
    weighted_time += flops / g;
    total_flops += flops;
    std::printf("%-10s %8lld %8lld %8lld %10.1f\n", s.what, (long long)N, (long long)s.k,
                (long long)s.m, g);
  }
  const double gemm_rate = total_flops / weighted_time;  // GFLOP/s at the model's FLOP mix

  const double step_s = median_step_seconds(cfg);
  const double tokens_per_s = double(N) / step_s;
  RunConfig shadowed = cfg;
  shadowed.shadow_every = 1;
  shadowed.shadow_variants = {"embed_rmsnorm_backward=bf16_accum"};
  const double shadow_step_s = median_step_seconds(shadowed);
  const double matmul_params = double(L) * 12 * C * C + double(V) * C;
  const double flops_per_token = 6 * matmul_params + 12.0 * L * m.seq_len * C;
  const double model_rate = tokens_per_s * flops_per_token / 1e9;

  std::printf("\nconfig %s: V=%lld C=%lld L=%lld T=%d B=%d, %d threads\n", config.c_str(),
              (long long)V, (long long)C, (long long)L, m.seq_len, cfg.batch, threads);
  std::printf("%-34s %12s\n", "measure", "value");
  std::printf("%-34s %12.1f\n", "Eigen GEMM GFLOP/s (model mix)", gemm_rate);
  std::printf("%-34s %12.0f\n", "divlab train tokens/s", tokens_per_s);
  std::printf("%-34s %12.1f\n", "model GFLOP/s", model_rate);
  std::printf("%-34s %11.0f%%\n", "model / GEMM (goal >= 50%)", 100 * model_rate / gemm_rate);
  std::printf("%-34s %11.1f%%\n", "shadow.every=1 cost (goal <= 15%)",
              100 * (shadow_step_s / step_s - 1));
  return 0;
}
