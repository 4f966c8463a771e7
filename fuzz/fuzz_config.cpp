// libFuzzer target: the config parser. Any input must either load or be refused with InputError
// (the exit-2 path); any other exception, crash or sanitizer report is a finding.
#include <cstddef>
#include <cstdint>
#include <string>

#include "experiments/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  // Plug-ins would dlopen whatever path the input names: not what this target is about.
  if (text.find("plugins") != std::string::npos) return 0;
  try {
    divlab::load_config_text(text, "fuzz input", {});
  } catch (const divlab::InputError&) {
  }
  // The same bytes as a command line's value: --set reads TOML values and bare words.
  try {
    divlab::load_config_text("", "fuzz input", {"shadow.variants=" + text, "train.lr=" + text});
  } catch (const divlab::InputError&) {
  }
  return 0;
}
