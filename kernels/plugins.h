// Loading candidate kernels from users' shared libraries (the C ABI in kernels/plugin_abi.h).
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

namespace divlab {

// A library that cannot be used: what() names the path and the reason (one line).
struct PluginError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Loads each library once (a path already loaded, under any spelling of it, is skipped) and adds
// its variants to the catalogues of their device where their dtype runs (fp32 kernels in both
// modes, bf16 kernels in the bf16 mode, fp16 kernels in the fp32 mode: kernels/plugin_abi.h).
// All or nothing per library: on any error nothing of that library is registered and it is
// unloaded again.
// Throws PluginError.
void load_plugins(const std::vector<std::string>& paths);

// Removes every plug-in variant from the catalogues and unloads the libraries.
void unload_plugins();

// A loaded plug-in variant: its op, name, activation dtype ("fp32", "bf16", "fp16") and library.
struct PluginVariant {
  std::string op, name, dtype, path;
};
std::vector<PluginVariant> plugin_variants();

// The library that added variant `variant` of `op` (as loaded), or "" for a built-in variant.
std::string plugin_of(const std::string& op, const std::string& variant);

// The mode that runs a plug-in kernel of activation dtype `dtype` ("fp32", "bf16", "fp16"):
// bf16 kernels run in the bf16 mode, fp16 kernels in the fp32 mode on fp16 copies, fp32 kernels
// in both (the bf16 mode through its adapters, unless the library has a bf16 twin). E.g. "the
// bf16 mode (train.precision = \"bf16\", check --precision bf16)".
std::string mode_running(const std::string& dtype);
// "a bf16 kernel", "an fp32 kernel", "an fp16 kernel".
std::string plugin_kernel_kind(const std::string& dtype);

// Where a plug-in variant of another dtype runs, when a mode that lacks it was asked for it: e.g.
// "'my_swiglu' (plug-in PATH) is a bf16 kernel: it runs in the bf16 mode (...)". "" if `variant`
// of `op` is no loaded plug-in's.
std::string plugin_mode_note(const std::string& op, const std::string& variant);

// Loaded libraries, in load order.
std::vector<std::string> loaded_plugins();

// What a trace records of each loaded library, so a rebuilt one is told apart: one line per
// library, "PATH sha256:HEX abi:N" (the file's content hash and the ABI it registered with).
std::string loaded_plugins_identity();

// "" when every library that `recorded` (a trace's /@plugins, as above) names and this process
// has loaded is the same file; otherwise a phrase naming the first that changed and both digests
// ("plug-in 'PATH' is not the file the run started with (sha256:... recorded, sha256:... now)").
std::string changed_plugin(const std::string& recorded);

}  // namespace divlab
