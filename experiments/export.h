// Getting data out for an independent re-implementation (e.g. a PyTorch twin): a trace's weights
// as a safetensors file, and any step's batch as HDF5.
#pragma once

#include <cstdint>
#include <string>

namespace divlab {

struct ExportOptions {
  std::string trace;
  std::string out;                // FILE.safetensors
  std::string weights = "final";  // final | initial | checkpoint (the newest)
  std::string dtype = "f32";      // f32 | f64
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
