// divlab: the command-line front end. Every subcommand reports bad input as one line on stderr
// and exit code 2, before writing anything.
#include <H5Cpp.h>

#include <CLI/CLI.hpp>
#include <iostream>

#include "experiments/config.h"
#include "experiments/train.h"

namespace divlab {
namespace {

int cmd_train(const std::string& config, const std::vector<std::string>& sets,
              const std::string& out, bool force, bool quiet) {
  const RunConfig cfg = load_config(config, sets);
  std::cout << "# divlab train: resolved config" << cfg.to_toml() << std::endl;
  TrainOptions opt;
  opt.out = out;
  opt.force = force;
  opt.progress = !quiet;
  const TrainResult r = train(cfg, opt);
  std::cout << "status " << r.status << "  steps " << r.steps << "  final loss " << r.final_loss
            << "  trace " << out << std::endl;
  return 0;
}

}  // namespace
}  // namespace divlab

int main(int argc, char** argv) {
  using namespace divlab;
  CLI::App app{"divlab: reproduce and measure training divergence caused by kernels"};
  app.require_subcommand(1);

  auto* train = app.add_subcommand("train", "train one model and write its trace");
  std::string config, out;
  std::vector<std::string> sets;
  bool force = false, quiet = false, help_config = false;
  train->add_option("--config", config, "TOML config file");
  train->add_option("--set", sets, "override keys: --set key=value [key=value ...]")
      ->allow_extra_args();
  train->add_option("--out", out, "trace file to write (HDF5)");
  train->add_flag("--force", force, "overwrite an existing trace");
  train->add_flag("--quiet", quiet, "no progress line");
  train->add_flag("--help-config", help_config, "list every config key and exit");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "divlab: " << e.what() << "\n";
    return 2;
  }
  try {
    if (*train) {
      if (help_config) {
        std::cout << describe_config_keys();
        return 0;
      }
      return cmd_train(config, sets, out, force, quiet);
    }
  } catch (const InputError& e) {
    std::cerr << "divlab: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "divlab: internal error: " << e.what() << "\n";
    return 1;
  } catch (const H5::Exception& e) {
    std::cerr << "divlab: HDF5 error in " << e.getFuncName() << ": " << e.getDetailMsg() << "\n";
    return 1;
  }
  return 0;
}
