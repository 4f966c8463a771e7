// Where divlab finds what it ships beside the binary (configs/, analysis/plots.py, data/),
// looked up at run time so that an installed or moved binary works:
//   $DIVLAB_HOME, if set;
//   else <the executable's folder>/../share/divlab, when it holds configs/ (cmake --install);
//   else the source tree the binary was built from (a build tree).
#pragma once

#include <string>

namespace divlab {

std::string resource_dir();
// This process's executable's path (/proc/self/exe's target, without the " (deleted)" the kernel
// appends once a rebuild has replaced the file), for naming it (a Slurm script, the resource
// lookup); "divlab" (looked up on PATH) when it cannot be read.
std::string self_exe();
// What starts another process of this very build: /proc/PID/exe, which stays this build after a
// rebuild replaced the file at self_exe(), while this process lives (every caller outlives its
// children). spawn_process uses it for an argv[0] of self_exe(); pass it where divlab is an
// argument of another program (compute-sanitizer).
std::string self_exe_to_start();
// resource_dir() + "/" + relative, e.g. resource_path("configs/reproduce.toml").
std::string resource_path(const std::string& relative);

}  // namespace divlab
