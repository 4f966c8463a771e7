#include "kernels/plugins.h"

#include <dlfcn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <tuple>
#include <type_traits>

#include "common/files.h"
#include "common/sha256.h"
#include "kernels/backend.h"
#include "kernels/bf16_activations.h"
#include "kernels/float_control.h"
#include "kernels/fp16_activations.h"
#ifdef DIVLAB_HAVE_CUDA
#include "kernels/cuda/runtime.h"
#endif
#include "kernels/plugin_calls.h"
#include "kernels/registry.h"

namespace divlab {

namespace {
struct Loaded {
  std::string path;
  std::string identity;  // the file itself (canonical path), so two spellings are one library
  std::string sha256;
  uint32_t abi = 0;
  void* handle;
  std::vector<PluginVariant> variants;
  // Removes every entry this library added, newest first.
  std::vector<std::function<void()>> undo;
};
std::vector<Loaded>& loaded() {
  static std::vector<Loaded> l;
  return l;
}

std::string str(const char* s) {
  return s ? s : "";
}

bool valid_name(const std::string& n) {
  return !n.empty() && std::all_of(n.begin(), n.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
}

// One variant as a library declared it, in either ABI.
struct Declared {
  std::string op, name, device;
  uint32_t abi = 0, dtype = DIVLAB_FP32, flags = 0;
  void (*fn)(void) = nullptr;
  VariantDoc doc;  // doc.benign: declared a control (DIVLAB_CONTROL)
};

// Each activation dtype a plug-in kernel may declare and the precision modes that run it (how
// they run it: register_variant); every sentence about where a plug-in kernel runs is made from
// this table.
struct DtypeModes {
  uint32_t dtype;
  const char* name;
  const char* kernel;   // with its article
  const char* doc_tag;  // after its summary in `divlab kernels`
  bool fp32_mode, bf16_mode;
};
constexpr DtypeModes kDtypeModes[] = {
    {DIVLAB_FP32, "fp32", "an fp32 kernel", " [plug-in]", true, true},
    {DIVLAB_BF16, "bf16", "a bf16 kernel", " [plug-in, bf16 kernel]", false, true},
    {DIVLAB_FP16, "fp16", "an fp16 kernel",
     " [plug-in, fp16 kernel on fp16 copies of its activations]", true, false},
};
static_assert(std::size(kDtypeModes) == 3, "one row per DIVLAB_* dtype of plugin_abi.h");

const DtypeModes* find_modes(uint32_t dtype) {
  for (const DtypeModes& m : kDtypeModes)
    if (m.dtype == dtype) return &m;
  return nullptr;
}
const DtypeModes& modes_of(uint32_t dtype) {
  if (const DtypeModes* m = find_modes(dtype)) return *m;
  throw std::logic_error("modes_of: dtype " + std::to_string(dtype) + " was not validated");
}
const DtypeModes* modes_named(const std::string& name) {
  for (const DtypeModes& m : kDtypeModes)
    if (name == m.name) return &m;
  return nullptr;
}

const char* dtype_name(uint32_t dtype) {
  return modes_of(dtype).name;
}

// Why `v` cannot go into a catalogue ("" if it can): an op the ABI lacks, a name taken.
template <class Cat>
std::string refusal(const Cat& cat, const Declared& v) {
  Op o{};
  if (!parse_op(v.op, &o)) return "unknown op '" + v.op + "'";
  if (!pluggable(o))
    return "op '" + v.op +
           "' is not replaceable by plug-ins (the ABI covers the model's ops, grad_reduce and the "
           "optimizer's updates)";
  std::string why;
  cat.for_each_op([&](const auto& ops, auto) {
    if (ops.op == v.op && ops.find(v.name))
      why = "variant '" + v.name + "' of " + v.op + " already exists";
  });
  return why;
}

// Adds `v` to `cat` as the plain kernel of its op: an ABI 1 kernel (no context) or an ABI 2
// kernel whose dtype is the catalogue's activation type.
template <class Cat>
void add_native(Cat& cat, const Declared& v) {
  cat.for_each_op([&](auto& ops, auto) {
    if (ops.op != v.op) return;
    using Fn = typename std::decay_t<decltype(ops)>::Function;
    const bool gpu = v.device == "cuda";
    if (v.abi == 1 && v.op == "embedding_forward") {
      if constexpr (std::is_same_v<Fn, OpSignatures<float>::EmbeddingForward>)
        ops.add(v.name, plugin_kernel<Abi1<Op::embedding_forward, Fn>, Fn>(gpu, v.fn), v.doc);
    } else if (v.abi == 1) {
      ops.add(v.name, plugin_kernel<Abi1Call<Fn>, Fn>(gpu, v.fn), v.doc);
    } else {
      ops.add(v.name, plugin_kernel<Abi2<Fn>, Fn>(gpu, v.fn), v.doc);
    }
  });
}

void remove_added(const Loaded& l) {
  for (auto it = l.undo.rbegin(); it != l.undo.rend(); ++it) (*it)();
}

// Undoes the addition of `v` to `cat`.
template <class Cat>
std::function<void()> removal(Cat& cat, const Declared& v) {
  return [&cat, op = v.op, name = v.name] {
    cat.for_each_op([&](auto& ops, auto) {
      if (ops.op == op) ops.remove(name);
    });
  };
}

// A table that cannot be used: what is wrong with it, for PluginError's line.
struct TableError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A variant's documentation as `divlab kernels` shows it, tagged with what kind of kernel it is.
template <class Variant>
VariantDoc plugin_doc(const Variant& v, bool control, uint32_t dtype) {
  const DtypeModes* m = find_modes(dtype);  // not validated yet: invalid() refuses it later
  return VariantDoc{str(v.summary) + (m ? m->doc_tag : ""),
                    str(v.wrong),
                    str(v.exposed_by),
                    str(v.masked_by),
                    control,
                    /*graphable=*/false};
}

// One row of either ABI's table in the loader's form (ABI 1: fp32 kernels, no flags).
Declared declared(const divlab_variant2& v) {
  const bool control = (v.flags & DIVLAB_CONTROL) != 0;
  return {str(v.op), str(v.name), str(v.device), 2,
          v.dtype,   v.flags,     v.fn,          plugin_doc(v, control, v.dtype)};
}
Declared declared(const divlab_variant& v) {
  return {str(v.op),   str(v.name), str(v.device), 1,
          DIVLAB_FP32, 0,           v.fn,          plugin_doc(v, false, DIVLAB_FP32)};
}

// The rows of the table that `symbol` returned, once its version is the one its ABI expects.
template <class Table>
std::vector<Declared> rows_of(const Table* p, const char* symbol, uint32_t version) {
  if (!p) throw TableError(std::string(symbol) + "() returned null");
  if (p->abi_version != version)
    throw TableError(std::string(symbol) + "(): built for plug-in ABI " +
                     std::to_string(p->abi_version) +
                     "; this divlab speaks ABI 1 and 2 (rebuild it against "
                     "kernels/plugin_abi.h)");
  std::vector<Declared> out;
  for (uint32_t i = 0; p->variants && i < p->count; ++i) out.push_back(declared(p->variants[i]));
  if (out.empty()) throw TableError("registers no variants");
  return out;
}

// The library's table, as Declared records (ABI 2 if it exports that registration function,
// else ABI 1). Reads every string the loader will read. Throws TableError.
std::vector<Declared> read_table(void* handle, uint32_t* abi) {
  if (auto reg2 = reinterpret_cast<divlab_plugin_register2_fn>(
          dlsym(handle, DIVLAB_PLUGIN_REGISTER2_SYMBOL))) {
    *abi = 2;
    return rows_of(reg2(), DIVLAB_PLUGIN_REGISTER2_SYMBOL, DIVLAB_PLUGIN_ABI2_VERSION);
  }
  if (auto reg = reinterpret_cast<divlab_plugin_register_fn>(
          dlsym(handle, DIVLAB_PLUGIN_REGISTER_SYMBOL))) {
    *abi = 1;
    return rows_of(reg(), DIVLAB_PLUGIN_REGISTER_SYMBOL, DIVLAB_PLUGIN_ABI_VERSION);
  }
  throw TableError("does not export " DIVLAB_PLUGIN_REGISTER2_SYMBOL
                   "() (ABI 2) or " DIVLAB_PLUGIN_REGISTER_SYMBOL
                   "() (ABI 1): see kernels/plugin_abi.h");
}

// Why declared variant `v` is unusable before any catalogue is asked ("" if it is not).
std::string invalid(const Declared& v) {
  if (!valid_name(v.name)) return "a name needs letters, digits or '_'";
  if (!v.fn) return "no function";
  if (v.flags & ~DIVLAB_CONTROL) return "unknown flags (only DIVLAB_CONTROL is defined)";
  if (v.dtype != DIVLAB_FP32 && v.dtype != DIVLAB_BF16 && v.dtype != DIVLAB_FP16)
    return "dtype " + std::to_string(v.dtype) +
           ": expected DIVLAB_FP32, DIVLAB_BF16 or DIVLAB_FP16";
  if (v.doc.benign && !v.doc.wrong.empty())
    return "declared a benign control (DIVLAB_CONTROL) but says what is wrong with it";
  return "";
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
    if (handle) try {
        uint32_t abi = 0;
        read_table(handle, &abi);  // a table that is merely wrong is the parent's to report
      } catch (...) {
      }
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

// A plug-in is a file, as every path divlab takes: a name without a '/' is one in the current
// folder. dlopen would search the library path for it instead (the binary's RUNPATH, the system's
// folders), so a library beside the user could fail to load, or another of its name load.
std::string file_of(const std::string& path) {
  return path.find('/') == std::string::npos ? "./" + path : path;
}

// The file a path names, resolved (two spellings of one library are one library).
std::string identity_of(const std::string& path) {
  std::error_code ec;
  const auto canonical = std::filesystem::canonical(file_of(path), ec);
  return ec ? file_of(path) : canonical.string();
}

std::string file_sha256(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "unreadable";
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return sha256_hex(bytes.str());
}

// Adds `v` to the catalogues of its device where its dtype runs (recording how to undo it):
//   fp32 (and every ABI 1 kernel): the fp32 mode as it is, the bf16 mode through the adapters
//        of kernels/bf16_activations.h;
//   bf16: the bf16 mode as it is;
//   fp16: the fp32 mode through the adapters of kernels/fp16_activations.h.
// Throws TableError (an unknown op, a name taken) or BackendError (an unknown device).
// `bf16_twin`: the library also declares a bf16 kernel of the same op, name and device, which the
// bf16 mode runs instead of adapting this one.
void register_variant(Loaded& l, const Declared& v, bool bf16_twin) {
  const auto check = [&](const auto& cat) {
    if (const std::string why = refusal(cat, v); !why.empty()) throw TableError(why);
  };
  const DtypeModes& modes = modes_of(v.dtype);
  const auto [bf16_cat, bf16_conv] = device_bf16_catalogue(v.device);
  const std::vector<Catalogue<float>*> cats = device_catalogues(v.device);
  if (modes.fp32_mode) {
    for (Catalogue<float>* cat : cats) {
      check(*cat);
      if (v.dtype == DIVLAB_FP16)
        add_fp16_plugin_variant(*cat, v.op, v.name, v.fn, v.doc, device_fp16_conversions(v.device));
      else
        add_native(*cat, v);
      l.undo.push_back(removal(*cat, v));
    }
  }
  if (modes.bf16_mode && !bf16_twin) {
    check(*bf16_cat);
    if (v.dtype == DIVLAB_BF16)
      add_native(*bf16_cat, v);
    else
      adopt_fp32_variant(*bf16_cat, *cats.front(), v.op, v.name, *bf16_conv);
    l.undo.push_back(removal(*bf16_cat, v));
  }
}

void load_one(const std::string& path) {
  const std::string identity = identity_of(path);
  for (const auto& l : loaded())
    if (l.identity == identity) return;
  auto fail = [&](const std::string& why) { throw PluginError("plug-in '" + path + "': " + why); };
  if (path.empty()) fail("an empty path (dlopen would return divlab itself)");
  // Opening a named pipe blocks until a writer comes (the probe would wait out its 30 s).
  const std::string file = file_of(path);
  struct stat st {};
  const bool found = stat(file.c_str(), &st) == 0;
  if (!found && errno == ENOENT) fail("cannot load: no such file");
  if (found && !S_ISREG(st.st_mode)) fail(special_file_kind(st.st_mode) + ", not a library");
  if (const std::string why = probe_in_child(file); !why.empty()) fail(why);
  dlerror();
  // The library's constructors and its registration function run in this thread: what they do
  // to its floating-point control, every op after them would compute under.
  void* handle = nullptr;
  std::string changed =
      call_restoring_float_control([&] { handle = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL); });
  if (!handle) fail(std::string("cannot load: ") + dlerror());
  Loaded l{path, identity, file_sha256(identity), 0, handle, {}, {}};
  try {
    std::vector<Declared> table;
    try {
      const std::string registering =
          call_restoring_float_control([&] { table = read_table(handle, &l.abi); });
      if (changed.empty()) changed = registering;
    } catch (const TableError& e) {
      fail(e.what());
    }
    if (!changed.empty()) {
      fail("loading it changed the thread's floating-point control (" + changed +
           "), under which every op in the process would then compute: a library linked with "
           "-ffast-math or -Ofast takes in crtfastmath.o (GCC 12 and older, among others), whose "
           "constructor turns flush-to-zero and denormals-are-zero on; link it without them "
           "(the compile flags may keep them)");
    }
    for (size_t i = 0; i < table.size(); ++i) {
      const Declared& v = table[i];
      const std::string where = "variant " + std::to_string(i) + " ('" + v.name + "')";
      if (const std::string why = invalid(v); !why.empty()) fail(where + ": " + why);
      try {
        const bool bf16_twin = std::any_of(table.begin(), table.end(), [&](const Declared& o) {
          return o.dtype == DIVLAB_BF16 && o.op == v.op && o.name == v.name && o.device == v.device;
        });
        register_variant(l, v, v.dtype == DIVLAB_FP32 && bf16_twin);
      } catch (const BackendError& e) {
        fail(where + ": " + e.what());
      } catch (const TableError& e) {
        fail(where + ": " + e.what());
      }
      l.variants.push_back({v.op, v.name, dtype_name(v.dtype), path});
    }
  } catch (...) {
    remove_added(l);
    dlclose(handle);
    throw;
  }
  loaded().push_back(std::move(l));
}
}  // namespace

void check_device_plugin_call(const OpContext& ctx) {
#ifdef DIVLAB_HAVE_CUDA
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess && cuda::debug_sync(ctx)) e = cudaStreamSynchronize(cuda::stream_of(ctx));
  if (e != cudaSuccess)
    throw cuda::CudaError(std::string("a CUDA plug-in kernel left an error: ") +
                          cudaGetErrorName(e) + " (" + cudaGetErrorString(e) +
                          "), from a launch it made or the work it queued");
#else
  (void)ctx;
#endif
}

void* plugin_workspace(const divlab_op_context* ctx, int region, size_t bytes) {
  if (!ctx || !ctx->divlab_private || region < 0 || region >= kPluginWorkspaceRegions)
    return nullptr;
  try {
    return static_cast<Workspace*>(ctx->divlab_private)
        ->get(kPluginWorkspaceSlot + region, std::max<size_t>(bytes, 1));
  } catch (...) {  // out of memory: the ABI is C, so the kernel is told with a null
    return nullptr;
  }
}

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

std::string changed_plugin(const std::string& recorded) {
  std::istringstream in(recorded);
  for (std::string library, digest, abi; in >> library >> digest >> abi;)
    for (const auto& l : loaded())
      if (l.identity == identity_of(library) && "sha256:" + l.sha256 != digest)
        return "plug-in '" + library + "' is not the file the run started with (" +
               digest.substr(0, 19) + "... recorded, sha256:" + l.sha256.substr(0, 12) + "... now)";
  return "";
}

std::vector<PluginVariant> plugin_variants() {
  std::vector<PluginVariant> out;
  for (const auto& l : loaded()) out.insert(out.end(), l.variants.begin(), l.variants.end());
  return out;
}

std::string plugin_of(const std::string& op, const std::string& variant) {
  for (const auto& v : plugin_variants())
    if (v.op == op && v.name == variant) return v.path;
  return "";
}

std::string mode_running(const std::string& dtype) {
  const DtypeModes* m = modes_named(dtype);
  if (!m) throw std::logic_error("mode_running: unknown dtype '" + dtype + "'");
  if (m->fp32_mode && m->bf16_mode) return "the fp32 and bf16 modes";
  return m->bf16_mode ? "the bf16 mode (train.precision = \"bf16\", check --precision bf16)"
                      : "the fp32 mode (train.precision = \"fp32\")";
}

std::string plugin_kernel_kind(const std::string& dtype) {
  const DtypeModes* m = modes_named(dtype);
  if (!m) throw std::logic_error("plugin_kernel_kind: unknown dtype '" + dtype + "'");
  return m->kernel;
}

std::string plugin_mode_note(const std::string& op, const std::string& variant) {
  for (const auto& v : plugin_variants()) {
    if (v.op != op || v.name != variant) continue;
    return "'" + variant + "' (plug-in " + v.path + ") is " + plugin_kernel_kind(v.dtype) +
           ": it runs in " + mode_running(v.dtype);
  }
  return "";
}

std::vector<std::string> loaded_plugins() {
  std::vector<std::string> out;
  for (const auto& l : loaded()) out.push_back(l.path);
  return out;
}

}  // namespace divlab
