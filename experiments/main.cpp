// divlab: the command-line front end. Every command reports bad input as one line on stderr
// and exit code 2, before writing anything; the commands themselves are experiments/cli.h's.
#include <H5Cpp.h>
#include <sys/prctl.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <iostream>
#include <vector>

#include "common/paths.h"
#include "common/process.h"
#include "common/signals.h"
#include "common/utf8.h"
#include "common/version.h"
#include "experiments/cli.h"
#include "experiments/config.h"
#include "experiments/train.h"
#include "io/trace.h"

int main(int argc, char** argv) {
  using namespace divlab;
  install_stop_handlers();  // first: a signal at any later instant is a clean stop
  // Started from /proc/PID/exe (common/process.h), a child's name would read "exe" in ps and top.
  prctl(PR_SET_NAME, "divlab");
  if (argc > 1) {
    const std::string command = argv[1];
    if (command == "train" || command == "sweep" || command == "reproduce" || command == "bisect")
      accept_stop_requests();
  }
  // A file-size limit (or a full disk) must surface as a write error, not kill the process.
  std::signal(SIGXFSZ, SIG_IGN);
  CLI::App app{"divlab: reproduce and measure training divergence caused by kernels", "divlab"};
  app.require_subcommand(1);
  const std::vector<Command> commands = {add_train_command(app),   add_check_command(app),
                                         add_bisect_command(app),  add_data_command(app),
                                         add_sample_command(app),  add_export_command(app),
                                         add_kernels_command(app), add_sweep_command(app),
                                         add_analyze_command(app), add_reproduce_command(app)};
  // Every option that takes a number refuses '' (experiments/cli.h's kNumberGiven).
  for (CLI::App* sub : app.get_subcommands({}))
    for (CLI::Option* option : sub->get_options())
      for (const char* number : {"INT", "UINT", "FLOAT", "NUMBER"})
        if (option->get_type_name().rfind(number, 0) == 0) option->check(kNumberGiven);

  app.set_version_flag("--version", std::string("divlab ") + kDivlabVersion + " (" + kGitCommit +
                                        ")\nresources (configs, plots, data): " + resource_dir());
  // No command, or `help`: the overview. A mistyped command: the nearest one.
  if (argc == 1 || std::string(argv[1]) == "help") {
    std::cout << app.help();
    return argc == 1 ? 2 : 0;
  }
  if (argv[1][0] != '-') {
    std::vector<std::string> names;
    for (const CLI::App* sub : app.get_subcommands({})) names.push_back(sub->get_name());
    if (std::find(names.begin(), names.end(), argv[1]) == names.end()) {
      const std::string best = closest_name(argv[1], names);
      std::cerr << "divlab: unknown command '" << argv[1] << "'"
                << (best.empty() ? "" : "; did you mean '" + best + "'?")
                << " (divlab --help lists them)\n";
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help, --version
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "divlab: " << e.what() << "\n";
    return 2;
  }
  try {
    die_with_starter_if_asked();  // started by a tool divlab started (common/process.h)
    // The GEMM tuner reads it (kernels/cuda/gemm_lt.h); a value it would not take is refused
    // here, before anything runs, instead of leaving tuning silently on.
    if (const char* v = std::getenv("DIVLAB_GEMM_TUNING");
        v && std::string(v) != "0" && std::string(v) != "1" && std::string(v) != "log")
      throw InputError(std::string("environment variable DIVLAB_GEMM_TUNING='") + v +
                       "': expected 0 (GEMMs run cuBLASLt's first choice), 1 (tuned) or log "
                       "(tuned, each choice on stderr)");
    // Every command may run OpenMP loops (check's references, analyze's statistics), and one
    // asked for more threads than start crashes in the first: refused here for all of them.
    default_threads();
    for (const Command& c : commands)
      if (*c.app) return c.run();
  } catch (const DeviceBusyError& e) {
    std::cerr << "divlab: " << one_line(e.what()) << "\n";
    return kExitDeviceBusy;
  } catch (const InputError& e) {
    std::cerr << "divlab: " << one_line(e.what()) << "\n";
    return 2;
  } catch (const TraceWriteError& e) {
    std::cerr << "divlab: " << one_line(e.what()) << "\n";
    return 1;
  } catch (const RunFailed& e) {
    std::cerr << "divlab: " << one_line(e.what()) << "\n";
    return 1;
  } catch (const StopRequested& e) {
    std::cerr << "divlab: " << one_line(e.what())
              << "; finished cells are kept, and running the same command again continues\n";
    return 128 + e.signal;
  } catch (const std::exception& e) {
    std::cerr << "divlab: internal error: " << one_line(e.what()) << "\n";
    return 1;
  } catch (const H5::Exception& e) {
    std::cerr << "divlab: HDF5 error in " << e.getFuncName() << ": " << e.getDetailMsg() << "\n";
    return 1;
  }
  return 0;
}
