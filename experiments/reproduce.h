// `divlab reproduce`: the reported failure as an experiment (grid -> sweep -> analyze -> matrix).
#pragma once

#include <string>

namespace divlab {

struct ReproduceOptions {
  std::string grid;  // default: configs/reproduce.toml in the source tree
  std::string out;   // default: runs/reproduce or runs/reproduce-quick
  bool quick = false;
  int jobs = 0;
  bool plots = true;
};

int run_reproduce(const ReproduceOptions& opt);

}  // namespace divlab
