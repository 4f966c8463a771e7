// Ranks as processes on one host's CPU (train.data_parallel = "processes"), joined by Unix
// sockets: rank 0 listens on an abstract socket named by the launch's nonce (no file, so no path
// length limit and nothing left behind), the others connect. An all-gather sends each rank's
// bytes to rank 0, which sends the whole stack back to every rank: R - 1 copies through rank 0,
// fine at the sizes a CPU trains. A rank that dies closes its socket, so its peers see an error
// at their next collective instead of waiting forever.
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "kernels/communicator.h"

namespace divlab {

namespace {

class Socket {
 public:
  explicit Socket(int fd = -1) : fd_(fd) {}
  ~Socket() {
    if (fd_ >= 0) close(fd_);
  }
  Socket(Socket&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Socket& operator=(Socket&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  int fd() const { return fd_; }

 private:
  int fd_;
};

sockaddr_un address_of(const std::string& nonce, socklen_t* length) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  // Abstract namespace: sun_path starts with a NUL byte; the name is the bytes after it.
  const std::string name = "divlab-ranks-" + nonce.substr(0, sizeof(a.sun_path) - 16);
  std::memcpy(a.sun_path + 1, name.data(), name.size());
  *length = socklen_t(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return a;
}

void send_all(int fd, const void* data, size_t bytes, int peer) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = send(fd, p, bytes, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      throw CommunicatorError("rank " + std::to_string(peer) +
                              " went away (send: " + std::strerror(errno) + ")");
    p += n, bytes -= size_t(n);
  }
}

void receive_all(int fd, void* data, size_t bytes, int peer) {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t n = recv(fd, p, bytes, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      throw CommunicatorError("rank " + std::to_string(peer) + " went away (" +
                              (n == 0 ? std::string("its socket closed") : std::strerror(errno)) +
                              ")");
    p += n, bytes -= size_t(n);
  }
}

class SocketCommunicator final : public Communicator {
 public:
  SocketCommunicator(const World& world, std::vector<Socket> peers)
      : world_(world), peers_(std::move(peers)) {}
  const World& world() const override { return world_; }
  void all_gather(const void* mine, void* all, size_t bytes, void*) override {
    char* stack = static_cast<char*>(all);
    const size_t total = bytes * size_t(world_.size);
    if (world_.rank != 0) {
      send_all(peers_[0].fd(), mine, bytes, 0);
      receive_all(peers_[0].fd(), stack, total, 0);
      return;
    }
    std::memmove(stack, mine, bytes);
    for (int r = 1; r < world_.size; ++r)
      receive_all(peers_[size_t(r)].fd(), stack + size_t(r) * bytes, bytes, r);
    for (int r = 1; r < world_.size; ++r) send_all(peers_[size_t(r)].fd(), stack, total, r);
  }
  void all_gather_host(const void* mine, void* all, size_t bytes, void* stream) override {
    all_gather(mine, all, bytes, stream);
  }

 private:
  World world_;
  std::vector<Socket> peers_;  // rank 0: one per other rank (index = rank); others: rank 0's at 0
};

}  // namespace

std::unique_ptr<Communicator> open_local_sockets(const World& world, const std::string& nonce,
                                                 double timeout_s) {
  socklen_t length = 0;
  const sockaddr_un address = address_of(nonce, &length);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(int64_t(timeout_s * 1e3));
  std::vector<Socket> peers(size_t(world.rank == 0 ? world.size : 1));
  if (world.rank == 0) {
    Socket listener(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (listener.fd() < 0 ||
        bind(listener.fd(), reinterpret_cast<const sockaddr*>(&address), length) != 0 ||
        listen(listener.fd(), world.size) != 0)
      throw CommunicatorError(std::string("rank 0 cannot listen for the other ranks: ") +
                              std::strerror(errno));
    for (int joined = 1; joined < world.size; ++joined) {
      Socket peer(accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC));
      if (peer.fd() < 0) {
        if (errno == EINTR) {
          --joined;
          continue;
        }
        throw CommunicatorError(std::string("accepting a rank: ") + std::strerror(errno));
      }
      int32_t rank = -1;
      receive_all(peer.fd(), &rank, sizeof rank, -1);
      if (rank < 1 || rank >= world.size || peers[size_t(rank)].fd() >= 0)
        throw CommunicatorError("a peer claimed rank " + std::to_string(rank));
      peers[size_t(rank)] = std::move(peer);
    }
  } else {
    for (;;) {
      Socket s(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
      if (s.fd() >= 0 &&
          connect(s.fd(), reinterpret_cast<const sockaddr*>(&address), length) == 0) {
        const int32_t rank = world.rank;
        send_all(s.fd(), &rank, sizeof rank, 0);
        peers[0] = std::move(s);
        break;
      }
      if (std::chrono::steady_clock::now() > deadline)
        throw CommunicatorError("rank 0 did not listen within " + std::to_string(int(timeout_s)) +
                                " s");
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // rank 0 may still be starting
    }
  }
  return std::make_unique<SocketCommunicator>(world, std::move(peers));
}

}  // namespace divlab
