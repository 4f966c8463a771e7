// Deliberately broken plug-ins for the loader's error tests; one source, built five times with
// BROKEN_KIND = 1 (wrong ABI version), 2 (a name clashing with a built-in variant), 3 (an unknown
// op), 4 (crashes in its registration function), 5 (crashes while the library is loaded, in a
// static constructor). A sixth library, no_register.cpp, exports no registration function.
#include <csignal>

#include "kernels/plugin_abi.h"

namespace {
void noop(float*, float*, const float*, const float*, const float*, const float*, int, int) {}

#if BROKEN_KIND == 1
const divlab_variant kVariants[] = {{"rmsnorm_backward", "from_the_future", "cpu",
                                     reinterpret_cast<void (*)(void)>(&noop), "", "", "", ""}};
const divlab_plugin kPlugin = {999u, 1, kVariants};
#elif BROKEN_KIND == 2
const divlab_variant kVariants[] = {{"rmsnorm_backward", "reference", "cpu",
                                     reinterpret_cast<void (*)(void)>(&noop), "", "", "", ""}};
const divlab_plugin kPlugin = {DIVLAB_PLUGIN_ABI_VERSION, 1, kVariants};
#else
const divlab_variant kVariants[] = {
    {"layernorm_backward", "mine", "cpu", reinterpret_cast<void (*)(void)>(&noop), "", "", "", ""}};
const divlab_plugin kPlugin = {DIVLAB_PLUGIN_ABI_VERSION, 1, kVariants};
#endif
}  // namespace

#if BROKEN_KIND == 5
__attribute__((constructor)) void crash_on_load() {
  std::raise(SIGSEGV);
}
#endif

extern "C" const divlab_plugin* divlab_plugin_register(void) {
#if BROKEN_KIND == 4
  std::raise(SIGSEGV);
#endif
  return &kPlugin;
}
