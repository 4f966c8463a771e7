#include "datasets/dataset.h"

#include <cmath>

#include "datasets/synthetic.h"
#include "experiments/config.h"

namespace divlab {

std::unique_ptr<Dataset> make_dataset(const std::string& spec, const DatasetOptions& opt) {
  if (spec == "uniform") return std::make_unique<IidDataset>(spec, opt.vocab, opt.seed, 0.0);
  if (spec.rfind("zipf:", 0) == 0) {
    const std::string s = spec.substr(5);
    double exponent = 0;
    try {
      size_t used = 0;
      exponent = std::stod(s, &used);
      if (used != s.size()) throw std::invalid_argument(s);
    } catch (const std::exception&) {
      throw InputError("data = '" + spec + "': the Zipf exponent '" + s + "' is not a number");
    }
    if (!(exponent > 0) || !std::isfinite(exponent))
      throw InputError("data = '" + spec + "': the Zipf exponent must be > 0");
    return std::make_unique<IidDataset>(spec, opt.vocab, opt.seed, exponent);
  }
  throw InputError("data = '" + spec + "': unknown dataset kind; valid: uniform, zipf:S, " +
                   "text:PATH, brown");
}

}  // namespace divlab
