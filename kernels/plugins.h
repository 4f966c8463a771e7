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
// its variants to the fp32 catalogues of their device (cpu, or both cuda GEMM modes). All or
// nothing per library: on any error nothing of that library is registered and it is unloaded again.
// Throws PluginError.
void load_plugins(const std::vector<std::string>& paths);

// Removes every plug-in variant from the catalogues and unloads the libraries.
void unload_plugins();

// The library that added variant `variant` of `op` (as loaded), or "" for a built-in variant.
std::string plugin_of(const std::string& op, const std::string& variant);

// Loaded libraries, in load order.
std::vector<std::string> loaded_plugins();

// What a trace records of each loaded library, so a rebuilt one is told apart: one line per
// library, "PATH sha256:HEX abi:N" (the file's content hash and the ABI it registered with).
std::string loaded_plugins_identity();

}  // namespace divlab
