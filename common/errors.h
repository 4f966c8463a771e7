// The project's error types for input it refuses: the CLI prints what() on one line and exits
// with the code named here, having created or modified nothing.
#pragma once

#include <stdexcept>

namespace divlab {

// Bad input from the user: exit code 2.
struct InputError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// The device cannot take the run now but could when idle (GPU memory held by other processes):
// exit code kExitDeviceBusy; a sweep retries the cell once another of its cells has ended.
struct DeviceBusyError : InputError {
  using InputError::InputError;
};
constexpr int kExitDeviceBusy = 75;  // EX_TEMPFAIL

// A run that a kernel stopped (it threw): its trace records "failed" and where; exit code 1,
// like a finding, not an internal error.
struct RunFailed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace divlab
