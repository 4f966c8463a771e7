// Where divlab finds what it ships beside the binary (configs/, analysis/plots.py, data/),
// looked up at run time so that an installed or moved binary works:
//   $DIVLAB_HOME, if set;
//   else <the executable's folder>/../share/divlab, when it holds configs/ (cmake --install);
//   else the source tree the binary was built from (a build tree).
#pragma once

#include <string>

namespace divlab {

std::string resource_dir();
// This process's executable (/proc/self/exe), for starting another process of divlab itself;
// "divlab" (looked up on PATH) when it cannot be read.
std::string self_exe();
// resource_dir() + "/" + relative, e.g. resource_path("configs/reproduce.toml").
std::string resource_path(const std::string& relative);

}  // namespace divlab
