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

// Loads each library once (a path already loaded is skipped) and adds its variants to the fp32
// catalogues of their device (cpu, or both cuda GEMM modes). All or nothing per library: on any
// error nothing of that library is registered and it is unloaded again. Throws PluginError.
void load_plugins(const std::vector<std::string>& paths);

// Removes every plug-in variant from the catalogues and unloads the libraries.
void unload_plugins();

// Loaded libraries, in load order.
std::vector<std::string> loaded_plugins();

}  // namespace divlab
