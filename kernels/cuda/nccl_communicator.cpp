// The NCCL communicator (kernels/communicator.h): all-gathers of raw bytes on the run's stream.
#include <cuda_runtime.h>
#include <nccl.h>

#include <string>

#include "common/rendezvous.h"
#include "kernels/communicator.h"

namespace divlab {

namespace {

void check_nccl(ncclResult_t r, const char* call) {
  if (r != ncclSuccess)
    throw CommunicatorError(std::string(call) + ": " + ncclGetErrorString(r) +
                            (r == ncclSystemError || r == ncclRemoteError
                                 ? " (a peer rank went away, or NCCL could not reach it)"
                                 : ""));
}
void check_runtime(cudaError_t e, const char* call) {
  if (e != cudaSuccess) throw CommunicatorError(std::string(call) + ": " + cudaGetErrorString(e));
}
#define DIVLAB_NCCL_CALL(call) check_nccl((call), #call)
#define DIVLAB_RUNTIME_CALL(call) check_runtime((call), #call)

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(const World& world, const ncclUniqueId& id) : world_(world) {
    DIVLAB_NCCL_CALL(ncclCommInitRank(&comm_, world.size, id, world.rank));
  }
  ~NcclCommunicator() override {
    if (staging_) cudaFree(staging_);
    // Every rank has left its last collective when the run ends normally; after a failure a
    // peer may be gone, and only an abort returns.
    if (comm_) ncclCommAbort(comm_);
  }
  const World& world() const override { return world_; }
  void all_gather(const void* mine, void* all, size_t bytes, void* stream) override {
    DIVLAB_NCCL_CALL(ncclAllGather(mine, all, bytes, ncclUint8, comm_, cudaStream_t(stream)));
  }
  void all_gather_host(const void* mine, void* all, size_t bytes, void* stream) override {
    const size_t need = bytes * size_t(world_.size + 1);
    if (need > staging_bytes_) {
      if (staging_) DIVLAB_RUNTIME_CALL(cudaFree(staging_));
      staging_ = nullptr;
      DIVLAB_RUNTIME_CALL(cudaMalloc(&staging_, need));
      staging_bytes_ = need;
    }
    auto* own = static_cast<char*>(staging_) + bytes * size_t(world_.size);
    const auto s = cudaStream_t(stream);
    DIVLAB_RUNTIME_CALL(cudaMemcpyAsync(own, mine, bytes, cudaMemcpyHostToDevice, s));
    all_gather(own, staging_, bytes, stream);
    DIVLAB_RUNTIME_CALL(
        cudaMemcpyAsync(all, staging_, bytes * size_t(world_.size), cudaMemcpyDeviceToHost, s));
    DIVLAB_RUNTIME_CALL(cudaStreamSynchronize(s));
  }

 private:
  World world_;
  ncclComm_t comm_ = nullptr;
  void* staging_ = nullptr;
  size_t staging_bytes_ = 0;
};

}  // namespace

std::unique_ptr<Communicator> open_nccl(const World& world, const std::string& rendezvous,
                                        const std::string& nonce, double timeout_s) {
  ncclUniqueId id{};
  try {
    if (world.rank == 0) {
      DIVLAB_NCCL_CALL(ncclGetUniqueId(&id));
      publish_token(rendezvous, nonce, std::string(id.internal, sizeof id.internal));
    } else {
      const std::string token = await_token(rendezvous, nonce, timeout_s);
      if (token.size() != sizeof id.internal)
        throw CommunicatorError("rendezvous file '" + rendezvous + "': not an NCCL id");
      token.copy(id.internal, sizeof id.internal);
    }
  } catch (const RendezvousError& e) {
    throw CommunicatorError(e.what());
  }
  return std::make_unique<NcclCommunicator>(world, id);
}

}  // namespace divlab
