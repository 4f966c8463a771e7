// The op context: what every op call receives first, so that a kernel needs no process globals.
//
//   stream     where a device kernel launches (a cudaStream_t; null: the legacy default stream).
//   seed       this call's seed, fresh for every call: a kernel that draws random bits (stochastic
//              rounding) draws them from it, so two runs, two models or a resumed run draw the
//              same bits for the same call (OpContextSource derives it from the caller's seed).
//   workspace  scratch memory owned by the caller: two models or two shadow taps never share it.
//   plugin_workspace  where a plug-in kernel's scratch comes from instead, when set: `divlab
//              check` gives plug-ins scratch with guards (kernels/guarded_workspace.h).
//   state      the called kernel's own bound state (Kernel::state below): an adapter's inner
//              kernel, a shadow tap, a profiler. The caller never sets it; Kernel does.
//   sync_each_launch  debugging (debug.sync_kernels): a device launcher waits for each kernel
//              it launches and names the one that failed, instead of a later call reporting it.
// A kernel that needs none of it (the CPU kernels, which run on the calling thread) is
// registered through Kernel::context_free (OpVariants::add does it for a plain function) and
// keeps its plain signature.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

#include "common/rng.h"

namespace divlab {

// Grow-only scratch regions, one per slot, valid until the next get() of the same slot.
class Workspace {
 public:
  virtual ~Workspace() = default;
  virtual void* get(int slot, size_t bytes) = 0;
  // Counts the regions moved by growth: a recording of calls that holds region addresses (a CUDA
  // graph) is stale once it has changed.
  uint64_t moves() const { return moves_; }

 protected:
  uint64_t moves_ = 0;
};

// Host memory scratch (the CPU backend's): 256-byte aligned regions, as plug-in ABI 2 promises.
class HostWorkspace final : public Workspace {
 public:
  void* get(int slot, size_t bytes) override;

 private:
  struct Region {
    std::unique_ptr<unsigned char, void (*)(void*)> data{nullptr, std::free};
    size_t bytes = 0;
  };
  std::vector<Region> regions_;
};

struct OpContext {
  void* stream = nullptr;
  uint64_t seed = 0;
  Workspace* workspace = nullptr;
  void* state = nullptr;
  bool sync_each_launch = false;
  Workspace* plugin_workspace = nullptr;
};

// A kernel as the model holds it: a function and the state bound to it. Calling it passes the
// caller's context with `state` replaced by the kernel's own, so wrappers (adapters, taps,
// profilers) nest without globals: each reads its state and calls the kernel it wraps.
template <class Fn>
struct Kernel;
template <class... Args>
struct Kernel<void (*)(const OpContext&, Args...)> {
  using Function = void (*)(const OpContext&, Args...);
  using ContextFree = void (*)(Args...);  // the same op without the context (plug-in ABI 1)
  Function fn = nullptr;
  void* state = nullptr;

  Kernel() = default;
  // A plain function converts implicitly: most kernels have no state.
  Kernel(Function f, void* s = nullptr) : fn(f), state(s) {}  // NOLINT(google-explicit-constructor)
  // A kernel that takes no context (a host kernel on the calling thread: no stream, no scratch,
  // no random bits; or an ABI-1 plug-in): called through a shim that reads it from the state.
  static Kernel context_free(ContextFree f) {
    // Function pointers round-trip through void* on every platform divlab builds on (POSIX).
    return Kernel(&call_context_free, reinterpret_cast<void*>(f));
  }

  void operator()(const OpContext& ctx, Args... args) const {
    OpContext own = ctx;
    own.state = state;
    fn(own, args...);
  }
  explicit operator bool() const { return fn != nullptr; }
  bool operator==(const Kernel& o) const { return fn == o.fn && state == o.state; }
  bool operator!=(const Kernel& o) const { return !(*this == o); }

 private:
  static void call_context_free(const OpContext& ctx, Args... args) {
    reinterpret_cast<ContextFree>(ctx.state)(args...);
  }
};

// The same function type without its context argument (the plug-in ABI 1 types).
template <class Fn>
using WithoutContext = typename Kernel<Fn>::ContextFree;

struct MemoryOps;

// Makes the context of each op call for one caller (a model, an optimizer, a shadow tap, a
// check): its own workspace in the backend's memory, its stream, and per-call seeds derived from
// (the caller's seed, how many calls since it was set), so they repeat exactly when the caller
// sets the same seed again (the trainer sets one per step, from the run's seed and the step).
class OpContextSource {
 public:
  explicit OpContextSource(const MemoryOps& memory, void* stream = nullptr);
  ~OpContextSource();
  OpContextSource(OpContextSource&&) noexcept;
  OpContextSource& operator=(OpContextSource&&) noexcept;

  void reseed(uint64_t seed) {
    seed_ = seed;
    calls_ = 0;
  }
  OpContext next() {
    OpContext ctx{stream_, mix64(seed_ ^ mix64(calls_++)), workspace_.get()};
    ctx.sync_each_launch = sync_each_launch_;
    ctx.plugin_workspace = plugin_workspace_;
    return ctx;
  }
  // Where the sequence is, and back there: a caller that discards calls (a failed CUDA graph
  // capture, which ran none of them) rewinds so the calls made again draw the same seeds.
  uint64_t calls() const { return calls_; }
  void rewind(uint64_t calls) { calls_ = calls; }
  void set_stream(void* stream) { stream_ = stream; }
  void set_sync_each_launch(bool on) { sync_each_launch_ = on; }
  // Plug-in kernels' scratch from `w` (which outlives the calls) instead of the workspace.
  void set_plugin_workspace(Workspace* w) { plugin_workspace_ = w; }
  void* stream() const { return stream_; }
  uint64_t workspace_moves() const { return workspace_->moves(); }

 private:
  void* stream_;
  std::unique_ptr<Workspace> workspace_;
  uint64_t seed_ = 0, calls_ = 0;
  bool sync_each_launch_ = false;
  Workspace* plugin_workspace_ = nullptr;
};

}  // namespace divlab
