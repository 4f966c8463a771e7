#include "experiments/crash_report.h"

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <cstring>

namespace divlab {

namespace {
struct FatalSignal {
  int number;
  const char* text;
};
constexpr FatalSignal kFatal[] = {{SIGSEGV, "SIGSEGV (Segmentation fault)"},
                                  {SIGBUS, "SIGBUS (Bus error)"},
                                  {SIGFPE, "SIGFPE (Arithmetic exception)"},
                                  {SIGILL, "SIGILL (Illegal instruction)"},
                                  {SIGABRT, "SIGABRT (Aborted)"}};

std::atomic<const CrashReport*> g_active{nullptr};
std::atomic<int> g_copy_fd{-1};

void put_to(int fd, const char* s) {
  size_t n = std::strlen(s);
  while (n > 0) {
    const ssize_t w = write(fd, s, n);
    if (w <= 0) return;
    s += w, n -= size_t(w);
  }
}
void put(const char* s) {
  put_to(STDERR_FILENO, s);
  if (const int fd = g_copy_fd.load(); fd >= 0) put_to(fd, s);
}

// Decimal digits of v (>= 0) into buf, without the C library's locale-aware formatting.
const char* decimal(int64_t v, char (&buf)[24]) {
  char* p = buf + sizeof buf - 1;
  *p = '\0';
  do {
    *--p = char('0' + v % 10);
    v /= 10;
  } while (v > 0 && p > buf);
  return p;
}

// A kernel that ends the process itself (exit() inside a plug-in) raises no signal, and its
// exit code (often 0) would pass for a finished run: while a report is alive, exiting writes the
// same kind of line and the process ends with code 1, its trace left as a killed run's.
extern "C" void on_exit_during_run() {
  if (const CrashReport* r = g_active.load()) {
    r->write_line(0);
    _exit(1);
  }
}

extern "C" void on_fatal_signal(int sig) {
  if (const CrashReport* r = g_active.load()) r->write_line(sig);
  // Die of the signal as before: its default action, raised again.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, nullptr);
  raise(sig);
}
}  // namespace

CrashReport::CrashReport(const OpNote& note, const std::vector<std::string>& variants,
                         const std::vector<std::pair<std::string, std::string>>& shadowed)
    : note_(note) {
  for (int i = 0; i < kOpCount; ++i) {
    const std::string op = op_name(Op(i));
    const std::string variant = size_t(i) < variants.size() ? variants[size_t(i)] : "reference";
    inside_.push_back(" in op " + op + " (variant " + variant + ")");
    after_.push_back(", outside any op (the last one entered: " + op + ")");
  }
  for (const auto& [op, variant] : shadowed)
    shadowed_.push_back(" in op " + op + " (variant " + variant + ", replayed by shadow mode)");
  const CrashReport* none = nullptr;
  if (!g_active.compare_exchange_strong(none, this)) return;  // another report is active
  installed_ = true;
  static const bool exit_hooked = std::atexit(on_exit_during_run) == 0;
  (void)exit_hooked;
  for (const FatalSignal& f : kFatal) {
    struct sigaction a {};
    a.sa_handler = on_fatal_signal;
    sigemptyset(&a.sa_mask);
    saved_.push_back({f.number, {}});
    sigaction(f.number, &a, &saved_.back().second);
  }
}

CrashReport::~CrashReport() {
  for (const auto& [number, action] : saved_) sigaction(number, &action, nullptr);
  if (installed_) g_active.store(nullptr);
}

std::string CrashReport::where() const {
  const int op = note_.op.load(), spec = note_.shadow.load();
  const int64_t step = note_.step.load();
  const std::string at = step >= 0 ? " at step " + std::to_string(step) : " before the first step";
  if (spec >= 0 && size_t(spec) < shadowed_.size()) return shadowed_[size_t(spec)].substr(1) + at;
  if (op < 0 || op >= kOpCount) return at.substr(1) + ", before any op";
  return note_.inside.load() ? inside_[size_t(op)].substr(1) + at
                             : at.substr(1) + after_[size_t(op)];
}

bool CrashReport::is_fatal(int signal) {
  for (const FatalSignal& f : kFatal)
    if (f.number == signal) return true;
  return false;
}

void CrashReport::copy_to(int fd) {
  g_copy_fd.store(fd);
}

void CrashReport::write_line(int signal) const {
  const char* name = signal == 0 ? "the process was ended by a call to exit()" : "a fatal signal";
  for (const FatalSignal& f : kFatal)
    if (f.number == signal) name = f.text;
  put(kPrefix);
  put(name);
  const int op = note_.op.load(), spec = note_.shadow.load();
  const int64_t step = note_.step.load();
  const bool shadowed = spec >= 0 && size_t(spec) < shadowed_.size();
  const bool known = !shadowed && op >= 0 && op < kOpCount;
  if (shadowed) put(shadowed_[size_t(spec)].c_str());
  if (known && note_.inside.load()) put(inside_[size_t(op)].c_str());
  char digits[24];
  if (step >= 0) {
    put(" at step ");
    put(decimal(step, digits));
  } else {
    put(" before the first step");
  }
  if (known && !note_.inside.load()) put(after_[size_t(op)].c_str());
  if (!known && !shadowed) put(", before any op");
  put("\n");
}

}  // namespace divlab
