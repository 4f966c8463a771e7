// Builds without NCCL: ranks over NCCL are refused with one line (kernels/communicator.h).
#include "kernels/communicator.h"

#ifndef DIVLAB_HAVE_NCCL
namespace divlab {

std::unique_ptr<Communicator> open_nccl(const World&, const std::string&, const std::string&,
                                        double) {
  throw CommunicatorError(
      "train.data_parallel = \"nccl\" needs the cuda build of divlab with NCCL (cmake --preset "
      "cuda on a machine with nccl.h and libnccl)");
}

}  // namespace divlab
#endif
