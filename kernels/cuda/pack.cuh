// Packs of 8 values for elementwise kernels: one thread loads and stores 16 bytes (8 bf16) or 32
// bytes (8 fp32, two 16-byte accesses) at once. Element by element, a bf16 tensor moves 2 bytes
// per load and an elementwise kernel reaches a fraction of the memory bandwidth (GPT-2 small's
// GELU backward: 250 us per call where the bytes take about 100).
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>

namespace divlab::cuda {

constexpr int kPack = 8;

template <class T>
struct alignas(16) Pack {
  T v[kPack];
};

// This block's index counted from the grid's last block, for kernels that stream over rows or
// packs between two GEMMs. Blocks start roughly in index order, and the GEMM before wrote its
// output's last rows last: those are the ones still in L2, and taken first they are read from
// there; the kernel's own first rows, written last, are then still in L2 for the GEMM after it,
// which begins with them. Which block takes which values changes no value: the bits stay.
__device__ __forceinline__ int64_t block_from_last() {
  return int64_t(gridDim.x) - 1 - int64_t(blockIdx.x);
}

// Whether every pointer allows packed access (16-byte aligned; cudaMalloc gives 256).
inline bool packable(std::initializer_list<const void*> pointers) {
  for (const void* p : pointers)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}

template <class T>
__device__ __forceinline__ Pack<T> load_pack(const T* p, int64_t pack) {
  return reinterpret_cast<const Pack<T>*>(p)[pack];
}
template <class T>
__device__ __forceinline__ void store_pack(T* p, int64_t pack, const Pack<T>& v) {
  reinterpret_cast<Pack<T>*>(p)[pack] = v;
}

// The same with the streaming cache hints (ld.global.cs, st.global.cs): for a value's last read
// and for a write no kernel reads back soon, so neither pushes out of L2 the lines about to be
// read again (cross-entropy's second pass over a row: 1529 -> 1412 us a step at GPT-2 small).
template <class T>
__device__ __forceinline__ Pack<T> load_pack_last(const T* p, int64_t pack) {
  static_assert(sizeof(Pack<T>) % 16 == 0, "whole 16-byte words");
  Pack<T> v;
  const auto* from = reinterpret_cast<const int4*>(p) + pack * int64_t(sizeof(Pack<T>) / 16);
  auto* to = reinterpret_cast<int4*>(&v);
#pragma unroll
  for (size_t i = 0; i < sizeof(Pack<T>) / 16; ++i) to[i] = __ldcs(from + i);
  return v;
}
template <class T>
__device__ __forceinline__ void store_pack_streaming(T* p, int64_t pack, const Pack<T>& v) {
  auto* to = reinterpret_cast<int4*>(p) + pack * int64_t(sizeof(Pack<T>) / 16);
  const auto* from = reinterpret_cast<const int4*>(&v);
#pragma unroll
  for (size_t i = 0; i < sizeof(Pack<T>) / 16; ++i) __stcs(to + i, from[i]);
}

}  // namespace divlab::cuda
