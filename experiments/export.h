// Getting data out for an independent re-implementation (e.g. a PyTorch twin): a trace's weights
// as a safetensors file, and any step's batch as HDF5.
#pragma once

#include <cstdint>
#include <string>

#include "common/named_enum.h"
#include "experiments/weights.h"

namespace divlab {

// The safetensors dtype the weights are written in (the trace keeps them in float64).
enum class ExportDtype { F32, F64 };
template <>
struct EnumNames<ExportDtype> {
  static constexpr std::pair<ExportDtype, const char*> table[] = {{ExportDtype::F32, "f32"},
                                                                  {ExportDtype::F64, "f64"}};
};

struct ExportOptions {
  std::string trace;
  std::string out;  // FILE.safetensors
  WhichWeights weights = WhichWeights::Final;
  ExportDtype dtype = ExportDtype::F32;
  bool force = false;
};
// Writes the weights with PyTorch's names and shapes, in the model's parameter order, with
// metadata (trace, which weights, step); returns a one-line summary. InputError when the trace
// does not hold them (naming the config key that keeps them).
std::string export_weights(const ExportOptions& opt);

struct BatchDumpOptions {
  std::string dataset;  // a `data` spec, as train's config has it
  int vocab = 256, batch = 8, seq = 32;
  uint64_t seed = 0;
  int64_t step = 0;
  std::string out;  // FILE.h5: /inputs and /targets, int64 [batch, seq]
  bool force = false;
};
// The training batch of `step` exactly as `divlab train` draws it for these settings.
void dump_batch(const BatchDumpOptions& opt);

// InputError naming --batch and --seq unless a batch of that shape has at most the positions a
// training step may have (2^31 - 1) and `bytes_per_position` of each fit in the host's memory.
void check_batch_fits(int batch, int seq, size_t bytes_per_position);

}  // namespace divlab
