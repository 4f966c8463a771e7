// Data-parallel ranks as processes, one GPU each over NCCL (train.data_parallel = "nccl") or
// on one host's CPU over sockets ("processes"): the one collective the trainer needs. Every
// rank's gradient is gathered whole, so each rank runs the run's grad_reduce variant on exactly the
// stacked gradients the simulated ranks reduce on one device: the same kernel on the same bits
// gives the same reduced gradient, for the reference, every variant and every plug-in alike
// (docs/guide.md, "Data-parallel ranks").
#pragma once

#include <cstddef>
#include <memory>
#include <stdexcept>
#include <string>

namespace divlab {

// Where one process stands among the run's ranks.
struct World {
  int rank = 0;
  int size = 1;
  int local_rank = 0;  // its index among the ranks on its host: which GPU it takes
};

// A collective failed or a peer went away; what() names the call.
struct CommunicatorError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual const World& world() const = 0;
  // Every rank's `bytes` at `mine` (device memory), laid out rank after rank at `all`
  // (world().size * bytes of device memory), queued on `stream`: the bits as they are, whatever
  // the values' type.
  virtual void all_gather(const void* mine, void* all, size_t bytes, void* stream) = 0;
  // The same for a few bytes of host memory; returns once `all` (host) holds them.
  virtual void all_gather_host(const void* mine, void* all, size_t bytes, void* stream) = 0;
};

// Joins the world of ranks as processes on this host's CPU (train.data_parallel =
// "processes"; kernels/socket_communicator.cpp): rank 0 listens on a socket named by `nonce`,
// the others connect within `timeout_s`. The arrays are host memory. Throws CommunicatorError.
std::unique_ptr<Communicator> open_local_sockets(const World& world, const std::string& nonce,
                                                 double timeout_s);

// Joins the world over NCCL on this process's current GPU: rank 0 makes the unique id and
// publishes it at `rendezvous` tagged `nonce` (common/rendezvous.h); the others wait for it up
// to `timeout_s`. Returns once every rank has joined. Throws CommunicatorError.
std::unique_ptr<Communicator> open_nccl(const World& world, const std::string& rendezvous,
                                        const std::string& nonce, double timeout_s);

}  // namespace divlab
