// Config: TOML + --set, and a resolved TOML that reads back the same. Bad keys and values, with
// the messages naming them, are the bad-input catalogue's (tests/bad_inputs/cases.toml, run
// through the CLI); here only what the CLI cannot show.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>

#include "experiments/config.h"
#include "experiments/train.h"
#include "io/toml_reader.h"
#include "tests/support/check.h"
#include "tests/support/fixtures.h"

namespace divlab {

namespace {
std::string write_temp(const std::string& text) {
  std::string path = testing::temp_dir("cfg") + "/config.toml";
  std::ofstream(path) << text;
  return path;
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
  EXPECT_EQ(c.optim.kind, OptimizerKind::AdamW);
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

// Bad values are the bad-input catalogue's (tests/bad_inputs/cases.toml, through the CLI); these
// tests hold what the CLI cannot show: how the reader reads valid TOML.
TEST(Config, CompleteTomlReadsAsTheSameConfig) {
  const RunConfig plain = load_config(write_temp("plugins = []\n[model]\nvocab = 1024\nd_model = "
                                                 "32\n[train]\nlr = 0.003\n"),
                                      {});
  // Inline tables, digit separators, another float spelling, a multi-line array with a
  // trailing comma, comments: one resolved config.
  const RunConfig rich = load_config(
      write_temp("plugins = [\n  # none yet\n]\nmodel = { vocab = 1_024, d_model = 0x20 }\n"
                 "[train] # the optimizer\nlr = 3e-3\n"),
      {});
  EXPECT_EQ(plain.to_toml(), rich.to_toml());
  EXPECT_EQ(rich.model.vocab, 1024);
  EXPECT_EQ(rich.model.d_model, 32);
  // --set spells the same values either way.
  EXPECT_EQ(load_config("", {"model.vocab=1_024", "model.d_model=32", "train.lr=0.003"}).to_toml(),
            plain.to_toml());
}

TEST(Config, TomlEntriesComeInFileOrderWithTheirLines) {
  // toml++ keeps a table's keys sorted; grids need the file's order (their axes' order).
  const auto entries = read_toml(
      "[axes.train]\nseed = [0, 1]\nbatch = [2]\n[axes]\ndata = "
      "[\"a\", \"b c=d\"]\n",
      "test");
  ASSERT_EQ(entries.size(), 3u);
  EXPECT_EQ(entries[0].key, "axes.train.seed");
  EXPECT_EQ(entries[1].key, "axes.train.batch");
  EXPECT_EQ(entries[2].key, "axes.data");
  EXPECT_EQ(entries[0].value.line, 2);
  EXPECT_EQ(entries[2].value.line, 5);
  EXPECT_EQ(entries[2].value.items.at(1).text, "b c=d");
  EXPECT_EQ(entries[2].value.toml(), "[\"a\", \"b c=d\"]");
}

TEST(Config, NonAsciiTextSurvivesTheParserWorkaround) {
  // toml++ 3.3.0 reaches __builtin_unreachable on these (upstream #190, #295); the UBSan build
  // (preset fuzz) runs this test, so the workaround is checked where the bug would show.
  const std::string text = "data = \"text:donn\u00e9es/\u3072\u3089\u304c\u306a\u00a7\"\n";
  const auto entries = read_toml(text, "test");
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].value.text, "text:donn\u00e9es/\u3072\u3089\u304c\u306a\u00a7");
  const auto continued = read_toml("s = \"\"\"\\\n\u00a7\"\"\"\n", "test");  // upstream #190
  EXPECT_EQ(continued.at(0).value.text, "\u00a7");
  EXPECT_THROW(read_toml("\xcc\xaa", "test"), InputError);  // upstream #295
  EXPECT_THROW(read_toml("k = 1 \u00e9\n", "test"), InputError);
  try {
    read_toml("\u00e9t\u00e9 = 1\n", "test");  // non-ASCII bare key: the message shows it as is
    FAIL();
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()).find("\xf3\xb0"), std::string::npos) << e.what();
  }
  EXPECT_EQ(read_toml_value("\"caf\u00e9\"").text, "caf\u00e9");
}

TEST(Config, EveryByteOfAStringValueRoundTripsThroughItsTomlText) {
  // What a trace's config_toml and a sweep's frozen grid write must read back as the value:
  // quotes, backslashes and every control character but NUL (refused as a value), DEL
  // included, which TOML's basic strings may not hold unescaped.
  for (int b = 1; b < 128; ++b) {
    TomlValue v;
    v.kind = TomlValue::Kind::String;
    v.text = std::string("a") + char(b) + "z";
    const std::string text = v.toml();
    EXPECT_EQ(text.find('\n'), std::string::npos) << "byte " << b << ": " << text;
    EXPECT_EQ(read_toml_value(text).text, v.text) << "byte " << b << ": " << text;
  }
  EXPECT_THROW(read_toml("data = \"a\\u0000z\"\n", "test"), InputError);
}

TEST(Config, CommandLineValuesAreTomlOrBareText) {
  EXPECT_EQ(read_toml_value("3").kind, TomlValue::Kind::Integer);
  EXPECT_EQ(read_toml_value("1e-3").text, "0.001");
  EXPECT_EQ(read_toml_value("true").kind, TomlValue::Kind::Boolean);
  const TomlValue bare = read_toml_value("zipf:1.1");
  EXPECT_TRUE(bare.bare);
  EXPECT_EQ(bare.text, "zipf:1.1");
  const TomlValue list = read_toml_value("[a=b, 'c=d']");
  ASSERT_EQ(list.items.size(), 2u);
  EXPECT_EQ(list.items[1].text, "c=d");
  // As in TOML: an empty list and a trailing comma, but no item left out between commas.
  EXPECT_TRUE(read_toml_value("[ ]").items.empty());
  EXPECT_EQ(read_toml_value("[a=b, c=d, ]").items.size(), 2u);
  for (const char* gap : {"[a=b,,c=d]", "[,a=b]", "[,]", "[a=b,,]"})
    EXPECT_THROW(read_toml_value(gap), InputError) << gap;
  // A newline cannot smuggle in a second key.
  EXPECT_TRUE(read_toml_value("1\nmodel.vocab = 2").bare);
  // Round trip of awkward strings through toml().
  TomlValue s;
  s.text = "quote \" backslash \\ tab \t";
  EXPECT_EQ(read_toml_value(s.toml()).text, s.text);
}

TEST(Config, FloatTextReadsBackExactly) {
  const uint64_t seed = testing::test_seed();
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> exponent(-300, 300);
  for (int i = 0; i < 1000; ++i) {
    const double x = std::pow(10.0, exponent(rng)) * (1 + 1e-3 * i);
    EXPECT_EQ(std::stod(float_text(x)), x) << "seed " << seed;
  }
  // Integral values from 2^63 up read back as TOML numbers too (a config written from them is
  // read again on resume, by analyze and by every rank), not as integers out of TOML's range.
  for (const double x : {0x1p63, -0x1p63, 1.2345678901234567e19, 0x1p63 - 1024, 1e300, -1e21}) {
    const TomlValue v = read_toml_value(float_text(x));
    EXPECT_FALSE(v.bare) << float_text(x);
    EXPECT_EQ(std::stod(v.text), x) << float_text(x);
  }
}

// A document written from entries reads back as the same entries: keys, kinds (an integral float
// stays a float) and values, strings with quotes and arrays included.
TEST(Config, TomlDocumentReadsBackAsTheSameEntries) {
  const std::string text =
      "[set.train]\ngrad_clip = 1.0\nsteps = 80\nname = \"a \\\"b\\\"\"\n"
      "[axes.train]\noptimizer = [\"sgd\", \"adamw train.lr=3e-3\"]\nlr = [1.0, 0.5, 2]\n"
      "\"odd key\" = true\n";
  const std::vector<TomlEntry> first = read_toml(text, "test");
  const std::vector<TomlEntry> again = read_toml(toml_document(first), "written");
  ASSERT_EQ(again.size(), first.size()) << toml_document(first);
  for (size_t i = 0; i < first.size(); ++i) {
    EXPECT_EQ(again[i].key, first[i].key);
    EXPECT_EQ(again[i].value.kind, first[i].value.kind) << first[i].key;
    EXPECT_EQ(again[i].value.toml(), first[i].value.toml()) << first[i].key;
    ASSERT_EQ(again[i].value.items.size(), first[i].value.items.size());
    for (size_t j = 0; j < first[i].value.items.size(); ++j)
      EXPECT_EQ(again[i].value.items[j].kind, first[i].value.items[j].kind) << first[i].key;
  }
  EXPECT_EQ(first[0].value.kind, TomlValue::Kind::Float);  // grad_clip = 1.0
}

// Parsing is pure: a config naming a plug-in that does not exist and a variant no catalogue has
// parses (nothing is loaded or looked up); resolving it is what refuses it.
TEST(Config, ParsingLoadsNothingAndResolvingChecksKernels) {
  const std::vector<std::string> sets = {"plugins=[/nonexistent/lib.so]",
                                         "kernels.linear_forward=no_such_variant"};
  const RunConfig cfg = parse_config("", sets);
  EXPECT_EQ(cfg.plugins, std::vector<std::string>{"/nonexistent/lib.so"});
  EXPECT_EQ(cfg.kernels.at("linear_forward"), "no_such_variant");
  EXPECT_THROW(resolve_kernels(cfg), InputError);
  const RunConfig named = parse_config("", {"kernels.linear_forward=no_such_variant"});
  try {
    resolve_kernels(named);
    FAIL() << "an unknown variant resolved";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("no_such_variant"), std::string::npos) << e.what();
  }
}

// Which runs replay their steps from a CUDA graph: judged on the catalogue's documentation of the
// kernels the run selects (here the CPU's, with the backend set to cuda by hand: the choice is
// the same code on either catalogue). Deterministic candidates (bf16 atomics, a changed formula)
// may; a kernel drawing random bits from its call's seed, the fp64 controls (host round trips),
// shadow mode, the profiler, debug.sync_kernels and debug.cuda_graphs = false may not.
TEST(Config, GraphStepsOnlyWhereAReplayChangesNothing) {
  const Catalogue<float>& cat = cpu_catalogue<float>();
  RunConfig cfg;
  cfg.backend = Backend::Cuda;
  const auto graphs = [&](const std::map<std::string, std::string>& kernels) {
    return graph_steps(cfg, false, cat, cat.select(kernels));
  };
  EXPECT_TRUE(graphs({}));
  EXPECT_TRUE(graphs({{"embed_rmsnorm_backward", "bf16_accum"}}));
  EXPECT_TRUE(graphs({{"rmsnorm_forward", "eps_outside_sqrt"}}));
  EXPECT_FALSE(graphs({{"embed_rmsnorm_backward", "bf16_stochastic_accum"}}));
  EXPECT_FALSE(graphs({{"linear_forward", "fp64_accum"}}));
  EXPECT_FALSE(graph_steps(cfg, /*profile=*/true, cat, cat.select({})));
  RunConfig other = cfg;
  other.shadow_every = 1;
  EXPECT_FALSE(graph_steps(other, false, cat, cat.select({})));
  other = cfg, other.sync_kernels = true;
  EXPECT_FALSE(graph_steps(other, false, cat, cat.select({})));
  other = cfg, other.cuda_graphs = false;
  EXPECT_FALSE(graph_steps(other, false, cat, cat.select({})));
  other = cfg, other.backend = Backend::Cpu;
  EXPECT_FALSE(graph_steps(other, false, cat, cat.select({})));
}

}  // namespace divlab
