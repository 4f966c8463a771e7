// How the processes of one data-parallel run find each other: rank 0 publishes a token (NCCL's
// unique id) in a file every rank can read (beside the run's trace, so a shared folder serves
// ranks on several hosts), and the others wait for it. A file left by an earlier, killed run
// is never taken for this run's: the token is tagged with a nonce all ranks of one launch share
// (divlab's launcher makes one; mpirun's, srun's and torchrun's job ids serve otherwise).
#pragma once

#include <functional>
#include <stdexcept>
#include <string>

namespace divlab {

// The wait ran out or was given up.
struct RendezvousError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Writes `token` (any bytes) tagged with `nonce` to `path` atomically: readers see all of it or
// nothing. Throws RendezvousError when the file cannot be written.
void publish_token(const std::string& path, const std::string& nonce, const std::string& token);

// Waits until `path` holds a token tagged with `nonce` and returns it; throws RendezvousError
// after `timeout_s` seconds, or as soon as `give_up()` (polled) says so: a stop request, a dead
// launcher.
std::string await_token(const std::string& path, const std::string& nonce, double timeout_s,
                        const std::function<bool()>& give_up = {});

// The token in a rendezvous file's `text` when it is tagged with `nonce`.
bool parse_token(const std::string& text, const std::string& nonce, std::string* token);

}  // namespace divlab
