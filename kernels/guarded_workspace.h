// Scratch that tells when a kernel writes past it: `divlab check`'s workspace for plug-in kernels.
//
// A plug-in asks its context for scratch by size (kernels/plugin_abi.h). Training's workspace
// rounds each region up and keeps the largest size any kernel asked of it, so a kernel that asks
// for too little (one value short, bytes where it meant floats) writes into the rounding, or into
// a region another op grew, or past the allocation into the heap: harmless at most sizes, a
// corrupted heap or another op's scratch at a few. Here every region is exactly the size asked,
// between two guards of all-ones bytes (NaN, as new scratch reads), and after the call the guards
// are read back: a write into either is named ("scratch region 0 (asked for 1020 bytes): written
// up to 4 bytes past its end"). A read past the end reads NaN.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "kernels/memory.h"
#include "kernels/op_context.h"

namespace divlab {

class GuardedWorkspace final : public Workspace {
 public:
  // `first_slot`: the slot that is reported as region 0 (plug-ins ask regions 0-7 of slots above
  // divlab's own).
  GuardedWorkspace(const MemoryOps& memory, int first_slot);
  ~GuardedWorkspace() override;
  GuardedWorkspace(const GuardedWorkspace&) = delete;
  GuardedWorkspace& operator=(const GuardedWorkspace&) = delete;

  // As training's: the same region for a size it holds (its contents kept), a new one, reading as
  // NaN, for a larger size. Only the new region's end is guarded then: a request for less than a
  // region holds keeps the guard at the larger end, as training keeps the larger region.
  void* get(int slot, size_t bytes) override;

  // One line per region (those replaced by larger ones included) whose guards were written since
  // it was made. Waits for the work queued on the legacy default stream (and the streams ordered
  // with it: every stream divlab creates) first.
  std::vector<std::string> stray_writes() const;

 private:
  struct Region {
    int slot = 0;
    unsigned char* base = nullptr;  // the allocation
    size_t before = 0, bytes = 0, after = 0;
    unsigned char* data() const { return base + before; }
  };
  Region allocate(int slot, size_t bytes) const;

  const MemoryOps& memory_;
  int first_slot_;
  std::vector<Region> live_;     // the region each slot returns now
  std::vector<Region> retired_;  // replaced by a larger one: checked, released at the end
};

// Op contexts whose plug-in scratch is a GuardedWorkspace: what `divlab check` calls kernels
// with. Movable: the workspace stays where the contexts point.
class GuardedContexts {
 public:
  GuardedContexts(const MemoryOps& memory, int first_slot)
      : scratch_(std::make_unique<GuardedWorkspace>(memory, first_slot)), contexts_(memory) {
    contexts_.set_plugin_workspace(scratch_.get());
  }
  OpContext next() { return contexts_.next(); }
  // The scratch's stray writes (GuardedWorkspace::stray_writes), appended to `lines`.
  void add_stray_writes(std::vector<std::string>* lines) const {
    for (std::string& line : scratch_->stray_writes()) lines->push_back(std::move(line));
  }

 private:
  std::unique_ptr<GuardedWorkspace> scratch_;
  OpContextSource contexts_;
};

}  // namespace divlab
