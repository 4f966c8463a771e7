// Config: TOML + --set, every rule naming its key, and a resolved TOML that reads back the same.
#include <cstdio>
#include <fstream>

#include "experiments/config.h"
#include "tests/support/check.h"

namespace divlab {

namespace {
std::string write_temp(const std::string& text) {
  char name[] = "/tmp/divlab_cfg_XXXXXX.toml";
  const int fd = mkstemps(name, 5);
  close(fd);
  std::ofstream(name) << text;
  return name;
}

std::string error_of(const std::string& toml, const std::vector<std::string>& sets) {
  const std::string path = toml.empty() ? "" : write_temp(toml);
  try {
    load_config(path, sets);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(Config, FileThenSetOverrides) {
  const auto path = write_temp(
      "data = \"zipf:1.1\"\n[model]\nd_model = 96\nn_heads = 3\n[train]\nlr = 0.05\n"
      "optimizer = \"adamw\"\n[kernels]\nembed_rmsnorm_backward = \"reference\"\n");
  const RunConfig c = load_config(path, {"train.lr=0.2", "model.n_layers=3"});
  EXPECT_EQ(c.data, "zipf:1.1");
  EXPECT_EQ(c.model.d_model, 96);
  EXPECT_EQ(c.model.n_layers, 3);
  EXPECT_DOUBLE_EQ(c.optim.lr, 0.2);
  EXPECT_EQ(c.optim.kind, "adamw");
  EXPECT_EQ(c.kernels.at("embed_rmsnorm_backward"), "reference");
}

TEST(Config, ResolvedTomlRoundTrips) {
  const RunConfig a = load_config(
      "", {"model.vocab=1000",
           "shadow.variants=[embed_rmsnorm_backward=bf16_accum, linear_forward=tail_skip]",
           "train.nesterov=true", "train.momentum=0.9"});
  const RunConfig b = load_config(write_temp(a.to_toml()), {});
  EXPECT_EQ(a.to_toml(), b.to_toml());
  EXPECT_EQ(b.shadow_variants, (std::vector<std::string>{"embed_rmsnorm_backward=bf16_accum",
                                                         "linear_forward=tail_skip"}));
}

TEST(Config, BadInputNamesTheKey) {
  EXPECT_NE(error_of("[model]\nd_modle = 3\n", {}).find("'model.d_modle'"), std::string::npos);
  EXPECT_NE(error_of("[model]\nd_modle = 3\n", {}).find("did you mean 'model.d_model'"),
            std::string::npos);
  EXPECT_NE(error_of("", {"model.d_model=abc"}).find("'model.d_model': expected an integer"),
            std::string::npos);
  EXPECT_NE(error_of("", {"model.d_model=100", "model.n_heads=3"}).find("not divisible"),
            std::string::npos);
  EXPECT_NE(error_of("", {"model.seq_len=0"}).find("'model.seq_len' = 0: must be > 0"),
            std::string::npos);
  EXPECT_NE(error_of("", {"train.batch=-4"}).find("'train.batch'"), std::string::npos);
  EXPECT_NE(error_of("", {"train.optimizer=adam"}).find("must be one of sgd, adamw"),
            std::string::npos);
  EXPECT_NE(error_of("", {"train.lr=nan"}).find("'train.lr'"), std::string::npos);
  EXPECT_NE(error_of("", {"kernels.embed_rmsnorm_backward=nope"}).find("valid: reference"),
            std::string::npos);
  EXPECT_NE(error_of("", {"kernels.nope=reference"}).find("unknown op"), std::string::npos);
  EXPECT_NE(error_of("", {"noequals"}).find("expected key=value"), std::string::npos);
  EXPECT_NE(error_of("", {"train.nesterov=true"}).find("train.momentum"), std::string::npos);
}

TEST(Config, MissingFileNamesThePath) {
  try {
    load_config("/nonexistent/x.toml", {});
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/x.toml"), std::string::npos);
  }
}
}  // namespace divlab
