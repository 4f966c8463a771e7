#include "kernels/plugins.h"

#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <tuple>
#include <type_traits>

#include "common/sha256.h"
#include "kernels/backend.h"
#include "kernels/bf16_activations.h"
#include "kernels/plugin_abi.h"
#include "kernels/registry.h"

namespace divlab {

namespace {
struct Loaded {
  std::string path;
  std::string identity;  // the file itself (canonical path), so two spellings are one library
  std::string sha256;
  uint32_t abi = 0;
  void* handle;
  // (catalogue, op, variant) of every entry this library added
  std::vector<std::tuple<Catalogue<float>*, std::string, std::string>> added;
  // ... and the same entries adapted into the bf16 modes (bf16 activations around the fp32 ABI)
  std::vector<std::tuple<Catalogue<float, bf16>*, std::string, std::string>> adopted;
};
std::vector<Loaded>& loaded() {
  static std::vector<Loaded> l;
  return l;
}

std::string str(const char* s) {
  return s ? s : "";
}

// The plug-in ABI 1 function types are the internal op signatures at float without their
// context, one for one: a plug-in's pointer is cast to its op's context-free type by the op's
// name (add_variant) and called through Kernel::context_free, so a signature changed on one
// side only must fail to build, not corrupt memory at run time.
using Fp32Ops = OpSignatures<float>;
static_assert(std::is_same_v<divlab_token, TokenId>);
static_assert(std::is_same_v<divlab_embedding_forward, WithoutContext<Fp32Ops::EmbeddingForward>>);
static_assert(std::is_same_v<divlab_rmsnorm_forward, WithoutContext<Fp32Ops::RmsnormForward>>);
static_assert(std::is_same_v<divlab_rmsnorm_backward, WithoutContext<Fp32Ops::RmsnormBackward>>);
static_assert(std::is_same_v<divlab_linear_forward, WithoutContext<Fp32Ops::LinearForward>>);
static_assert(std::is_same_v<divlab_linear_backward, WithoutContext<Fp32Ops::LinearBackward>>);
static_assert(std::is_same_v<divlab_attention_forward, WithoutContext<Fp32Ops::AttentionForward>>);
static_assert(
    std::is_same_v<divlab_attention_backward, WithoutContext<Fp32Ops::AttentionBackward>>);
static_assert(std::is_same_v<divlab_gelu_forward, WithoutContext<Fp32Ops::GeluForward>>);
static_assert(std::is_same_v<divlab_gelu_backward, WithoutContext<Fp32Ops::GeluBackward>>);
static_assert(std::is_same_v<divlab_add, WithoutContext<Fp32Ops::Add>>);
static_assert(std::is_same_v<divlab_cross_entropy, WithoutContext<Fp32Ops::CrossEntropy>>);
static_assert(
    std::is_same_v<divlab_embed_rmsnorm_backward, WithoutContext<Fp32Ops::EmbedRmsnormBackward>>);
static_assert(std::is_same_v<divlab_rope_forward, WithoutContext<Fp32Ops::RopeForward>>);
static_assert(std::is_same_v<divlab_rope_backward, WithoutContext<Fp32Ops::RopeBackward>>);
static_assert(std::is_same_v<divlab_gqa_forward, WithoutContext<Fp32Ops::GqaForward>>);
static_assert(std::is_same_v<divlab_gqa_backward, WithoutContext<Fp32Ops::GqaBackward>>);
static_assert(std::is_same_v<divlab_swiglu_forward, WithoutContext<Fp32Ops::SwigluForward>>);
static_assert(std::is_same_v<divlab_swiglu_backward, WithoutContext<Fp32Ops::SwigluBackward>>);
static_assert(std::is_same_v<divlab_softcap_forward, WithoutContext<Fp32Ops::SoftcapForward>>);
static_assert(std::is_same_v<divlab_softcap_backward, WithoutContext<Fp32Ops::SoftcapBackward>>);
static_assert(
    std::is_same_v<divlab_add_rmsnorm_forward, WithoutContext<Fp32Ops::AddRmsnormForward>>);

bool valid_name(const std::string& n) {
  return !n.empty() && std::all_of(n.begin(), n.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
}

// Adds one variant to `cat`; returns false (with `why`) if its op is unknown or not pluggable, or
// its name is taken.
bool add_variant(Catalogue<float>& cat, const divlab_variant& v, std::string* why) {
  const std::string op = str(v.op), name = str(v.name);
  if (Op o{}; parse_op(op, &o) && !pluggable(o)) {
    *why = "op '" + op + "' is not replaceable by plug-ins (ABI 1 covers the model's ops)";
    return false;
  }
  bool done = false;
  cat.for_each_op([&](auto& ops, auto) {
    if (ops.op != op || done) return;
    done = true;
    if (ops.find(name)) {
      *why = "variant '" + name + "' of " + op + " already exists";
      return;
    }
    using Fn = typename std::decay_t<decltype(ops)>::Function;
    ops.add(name, reinterpret_cast<typename Kernel<Fn>::ContextFree>(v.fn),
            {str(v.summary) + " [plug-in]", str(v.wrong), str(v.exposed_by), str(v.masked_by)});
  });
  if (!done) *why = "unknown op '" + op + "'";
  return done && why->empty();
}

void remove_added(const Loaded& l) {
  for (const auto& [cat, op, name] : l.adopted) drop_adopted_variant(*cat, op, name);
  for (const auto& added : l.added) {
    const std::string &op = std::get<1>(added), &name = std::get<2>(added);
    std::get<0>(added)->for_each_op([&](auto& ops, auto) {
      if (ops.op == op) ops.remove(name);
    });
  }
}

// A library can crash or hang in its constructors or its registration function. It is loaded,
// registered and its table read first in a forked child, so that a crash is reported as one line
// instead of taking this process (a sweep, a run) down. Returns why the child failed, or "".
std::string probe_in_child(const std::string& path) {
  constexpr double kSeconds = 30;
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return "";  // cannot fork: the load below is the only check
  if (pid == 0) {
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    auto reg = handle ? reinterpret_cast<divlab_plugin_register_fn>(
                            dlsym(handle, DIVLAB_PLUGIN_REGISTER_SYMBOL))
                      : nullptr;
    const divlab_plugin* p = reg ? reg() : nullptr;
    volatile size_t touched = 0;  // reads every string the loader will read
    if (p && p->abi_version == DIVLAB_PLUGIN_ABI_VERSION && p->variants)
      for (uint32_t i = 0; i < p->count; ++i)
        for (const char* s :
             {p->variants[i].op, p->variants[i].name, p->variants[i].device, p->variants[i].summary,
              p->variants[i].wrong, p->variants[i].exposed_by, p->variants[i].masked_by})
          touched += s ? std::strlen(s) : 0;
    (void)touched;
    _exit(0);
  }
  const auto start = std::chrono::steady_clock::now();
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >
        kSeconds) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return "did not finish loading within 30 s";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if (WIFSIGNALED(status))
    return std::string("crashed while loading (signal ") + std::to_string(WTERMSIG(status)) + ", " +
           strsignal(WTERMSIG(status)) + "), in a probe; nothing of it was loaded";
  if (WIFEXITED(status) && WEXITSTATUS(status) != 0)  // exit() in its code, or a sanitizer
    return "crashed while loading (exit status " + std::to_string(WEXITSTATUS(status)) +
           "), in a probe; nothing of it was loaded";
  return "";
}

// The file a path names, when it names one by location (dlopen searches the library path for a
// bare name, so that is left as it is).
std::string identity_of(const std::string& path) {
  if (path.find('/') == std::string::npos) return path;
  std::error_code ec;
  const auto canonical = std::filesystem::canonical(path, ec);
  return ec ? path : canonical.string();
}

std::string file_sha256(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "unreadable";
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return sha256_hex(bytes.str());
}

void load_one(const std::string& path) {
  const std::string identity = identity_of(path);
  for (const auto& l : loaded())
    if (l.identity == identity) return;
  auto fail = [&](const std::string& why) { throw PluginError("plug-in '" + path + "': " + why); };
  if (const std::string why = probe_in_child(path); !why.empty()) fail(why);
  dlerror();
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) fail(std::string("cannot load: ") + dlerror());
  Loaded l{path, identity, file_sha256(identity), 0, handle, {}, {}};
  try {
    auto reg =
        reinterpret_cast<divlab_plugin_register_fn>(dlsym(handle, DIVLAB_PLUGIN_REGISTER_SYMBOL));
    if (!reg)
      fail("does not export " DIVLAB_PLUGIN_REGISTER_SYMBOL "() (see kernels/plugin_abi.h)");
    const divlab_plugin* p = reg();
    if (!p) fail(DIVLAB_PLUGIN_REGISTER_SYMBOL "() returned null");
    if (p->abi_version != DIVLAB_PLUGIN_ABI_VERSION)
      fail("built for plug-in ABI " + std::to_string(p->abi_version) + "; this divlab speaks ABI " +
           std::to_string(DIVLAB_PLUGIN_ABI_VERSION) +
           " (rebuild it against kernels/plugin_abi.h)");
    if (p->count == 0 || !p->variants) fail("registers no variants");
    l.abi = p->abi_version;
    for (uint32_t i = 0; i < p->count; ++i) {
      const divlab_variant& v = p->variants[i];
      const std::string name = str(v.name),
                        where = "variant " + std::to_string(i) + " ('" + name + "')";
      if (!valid_name(name)) fail(where + ": a name needs letters, digits or '_'");
      if (!v.fn) fail(where + ": no function");
      std::vector<Catalogue<float>*> cats;
      try {
        cats = device_catalogues(str(v.device));
      } catch (const BackendError& e) {
        fail(where + ": " + e.what());
      }
      for (Catalogue<float>* cat : cats) {
        std::string why;
        if (!add_variant(*cat, v, &why)) fail(where + ": " + why);
        l.added.emplace_back(cat, str(v.op), name);
      }
      // The bf16 mode of the same device runs it on widened copies of its bf16 inputs.
      const auto [bf16_cat, conv] = device_bf16_catalogue(str(v.device));
      adopt_fp32_variant(*bf16_cat, *cats.front(), str(v.op), name, *conv);
      l.adopted.emplace_back(bf16_cat, str(v.op), name);
    }
  } catch (...) {
    remove_added(l);
    dlclose(handle);
    throw;
  }
  loaded().push_back(std::move(l));
}
}  // namespace

void load_plugins(const std::vector<std::string>& paths) {
  for (const auto& p : paths) load_one(p);
}

void unload_plugins() {
  for (auto it = loaded().rbegin(); it != loaded().rend(); ++it) {
    remove_added(*it);
    dlclose(it->handle);
  }
  loaded().clear();
}

std::string loaded_plugins_identity() {
  std::string out;
  for (const auto& l : loaded())
    out += l.path + " sha256:" + l.sha256 + " abi:" + std::to_string(l.abi) + "\n";
  return out;
}

std::string plugin_of(const std::string& op, const std::string& variant) {
  for (const auto& l : loaded())
    for (const auto& added : l.added)
      if (std::get<1>(added) == op && std::get<2>(added) == variant) return l.path;
  return "";
}

std::vector<std::string> loaded_plugins() {
  std::vector<std::string> out;
  for (const auto& l : loaded()) out.push_back(l.path);
  return out;
}

}  // namespace divlab
