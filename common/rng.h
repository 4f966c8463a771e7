// Portable, explicit random numbers. std:: distributions differ between standard libraries, so
// the lab draws everything (init weights, data) from this generator: same seed, same numbers, on
// every machine and compiler.
#pragma once
#include <cmath>
#include <cstdint>

namespace divlab {

// splitmix64 (Steele, Lea, Flood 2014): a 64-bit counter through a strong bit mixer.
#ifdef __CUDACC__
__host__ __device__
#endif
    inline uint64_t
    mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

class Rng {
 public:
  // A stream is identified by (seed, stream, index): e.g. (run seed, "data", step). Streams are
  // independent of each other, so the batch of step s never depends on what ran before it.
  explicit Rng(uint64_t seed, uint64_t stream = 0, uint64_t index = 0)
      : state_(mix64(mix64(seed ^ 0x6a09e667f3bcc909ULL) + stream) + mix64(index)) {}

  uint64_t next() { return mix64(state_ += 0x9e3779b97f4a7c15ULL); }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return double(next() >> 11) * 0x1.0p-53; }
  // Uniform integer in [0, n), without modulo bias (Lemire's multiply-shift with rejection).
  uint64_t below(uint64_t n) {
    while (true) {
      const unsigned __int128 m = (unsigned __int128)next() * n;
      const uint64_t low = uint64_t(m);
      if (low >= n || low >= (-n) % n) return uint64_t(m >> 64);
    }
  }
  // Standard normal (Box-Muller; one of the pair is discarded to keep the state simple).
  double normal() {
    const double u1 = 1.0 - uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

  uint64_t state() const { return state_; }

 private:
  uint64_t state_;
};

// Named stream ids, so two uses of one seed never share numbers.
enum RngStream : uint64_t {
  kStreamInit = 1,
  kStreamData = 2,
  kStreamEvalData = 3,
  kStreamKernel = 4
};

}  // namespace divlab
