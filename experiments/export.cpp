#include "experiments/export.h"

#include <cstring>

#include "common/errors.h"
#include "common/files.h"
#include "datasets/dataset.h"
#include "experiments/config.h"
#include "experiments/train.h"
#include "experiments/weights.h"
#include "io/toml_reader.h"
#include "kernels/backend.h"

namespace divlab {

namespace {

// The model from a trace's resolved config, parsed without loading its kernels or plug-ins (the
// exporting machine need not have them): every [model] key, so the layout is the run's (the
// llama family, a tied head, the MLP's width, grouped key/value heads).
ModelConfig model_of(const TraceReader& r, const std::string& path) {
  return parse_config_text(r.string_attr("/", "config_toml"), path, {}, ConfigFrom::Trace).model;
}

void append_le(std::string& out, uint64_t x) {
  for (int i = 0; i < 8; ++i) out += char((x >> (8 * i)) & 0xff);
}

std::string json_string(const std::string& s) {
  TomlValue v;  // TOML's basic-string escapes are JSON's for what names and paths hold
  v.text = s;
  return v.toml();
}

}  // namespace

std::string export_weights(const ExportOptions& opt) {
  check_out_is_no_input(opt.out, {{opt.trace, "the trace being read"}}, "");
  check_output_path(opt.out, opt.force);
  const TraceReader r(opt.trace);
  const std::vector<ParamInfo> layout = param_layout(model_of(r, opt.trace));
  auto w = trace_weights(r, opt.weights, layout);
  if (!w && opt.weights == WhichWeights::Checkpoint)
    throw InputError(no_checkpoint_message(r, opt.trace));
  const std::string which = name_of(opt.weights);
  if (!w)
    throw InputError("trace '" + opt.trace + "': holds no " + which +
                     " weights (train with --set trace." + which +
                     "_weights=true; --weights checkpoint exports the newest checkpoint)");
  const std::vector<double>& params = w->params;
  const int64_t step = w->step;
  const int64_t expected = layout.back().offset + layout.back().size;
  if (int64_t(params.size()) != expected)
    throw InputError("trace '" + opt.trace + "': " + std::to_string(params.size()) +
                     " weights for a model of " + std::to_string(expected));

  // safetensors: an 8-byte little-endian header length, a JSON header (name -> dtype, shape,
  // byte range; __metadata__), then the tensors' little-endian bytes, here in parameter order.
  const size_t width = opt.dtype == ExportDtype::F32 ? 4 : 8;
  std::string header = "{\"__metadata__\":{\"format\":\"pt\",\"source\":" + json_string(opt.trace) +
                       ",\"weights\":\"" + which + "\",\"step\":\"" + std::to_string(step) + "\"}";
  for (const ParamInfo& p : layout) {
    std::string shape;
    for (int64_t d : p.shape) shape += (shape.empty() ? "" : ",") + std::to_string(d);
    header += "," + json_string(p.name) + ":{\"dtype\":\"" + (width == 4 ? "F32" : "F64") +
              "\",\"shape\":[" + shape + "],\"data_offsets\":[" + std::to_string(p.offset * width) +
              "," + std::to_string((p.offset + p.size) * width) + "]}";
  }
  header += "}";
  while ((8 + header.size()) % 8 != 0) header += ' ';
  std::string bytes;
  bytes.reserve(8 + header.size() + params.size() * width);
  append_le(bytes, header.size());
  bytes += header;
  static_assert(sizeof(float) == 4 && sizeof(double) == 8);
  for (double x : params) {  // x86-64 and aarch64 Linux are little-endian
    char raw[8];
    if (width == 4) {
      const float f = float(x);
      std::memcpy(raw, &f, 4);
    } else {
      std::memcpy(raw, &x, 8);
    }
    bytes.append(raw, width);
  }
  const MadeFolders folders(opt.out, "--out");
  if (!write_file_atomically(opt.out, bytes))
    throw InputError("--out '" + opt.out + "': cannot be written");
  return "wrote " + opt.out + ": " + std::to_string(layout.size()) + " tensors, " +
         std::to_string(params.size()) + " " + name_of(opt.dtype) + " weights (" + which +
         ", after " + std::to_string(step) + " steps)";
}

void check_batch_fits(int batch, int seq, size_t bytes_per_position) {
  if (batch < 1 || seq < 1) throw InputError("--batch and --seq: must be >= 1");
  const int64_t positions = int64_t(batch) * seq;
  if (positions >= (int64_t(1) << 31))
    throw InputError("--batch * --seq = " + std::to_string(positions) +
                     " positions: at most 2^31 - 1, as train.batch * model.seq_len");
  try {  // the host's own check, as a run's memory is checked before it allocates
    check_backend_fits(Backend::Cpu, size_t(positions) * bytes_per_position,
                       "--batch " + std::to_string(batch) + " x --seq " + std::to_string(seq));
  } catch (const BackendError& e) {
    throw InputError(e.what());
  }
}

void dump_batch(const BatchDumpOptions& opt) {
  if (opt.step < 0) throw InputError("--dump-batch " + std::to_string(opt.step) + ": must be >= 0");
  // The batch in 32-bit ids, then both halves widened to int64 for the file.
  check_batch_fits(opt.batch, opt.seq, 2 * sizeof(TokenId) + 2 * sizeof(int64_t));
  check_out_is_no_input(opt.out, {}, opt.dataset);
  check_output_path(opt.out, opt.force);
  DatasetOptions dopt;
  dopt.vocab = opt.vocab, dopt.seq_len = opt.seq, dopt.seed = opt.seed;
  const auto data = make_dataset(opt.dataset, dopt);
  const int64_t n = int64_t(opt.batch) * opt.seq;
  std::vector<TokenId> in(n), tgt(n);
  data->batch(opt.step, opt.batch, opt.seq, in.data(), tgt.data());
  const MadeFolders folders(opt.out, "--out");
  TraceWriter w(opt.out, opt.force);
  using K = TraceWriter::Kind;
  w.attr("/", "dataset", data->info().spec);
  w.attr("/", "vocab", int64_t(opt.vocab));
  w.attr("/", "seed", int64_t(opt.seed));
  w.attr("/", "step", opt.step);
  w.array("/inputs", K::Int64, std::vector<int64_t>{opt.batch, opt.seq});
  w.array("/targets", K::Int64, std::vector<int64_t>{opt.batch, opt.seq});
  w.write_array("/inputs", std::vector<int64_t>(in.begin(), in.end()));
  w.write_array("/targets", std::vector<int64_t>(tgt.begin(), tgt.end()));
  w.publish();
}

}  // namespace divlab
