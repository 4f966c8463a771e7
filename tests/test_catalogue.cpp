// Catalogue::select: unknown names are refused with the valid ones, and a variant that runs
// only with a partner (the GPU's fused attention pair, the forwards that save probabilities for
// the batched backward) brings that partner along and refuses a conflicting explicit choice.
#include <gtest/gtest.h>

#include "kernels/registry.h"

namespace divlab {

namespace {
std::string refusal(const Catalogue<float>& cat, const std::map<std::string, std::string>& c) {
  try {
    cat.select(c);
  } catch (const UnknownKernel& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(Catalogue, UnknownOpsAndVariantsNameTheValidOnes) {
  const auto& cat = cpu_catalogue<float>();
  EXPECT_NE(refusal(cat, {{"attention_fwd", "reference"}}).find("valid ops: "), std::string::npos);
  const std::string e = refusal(cat, {{"attention_forward", "nope"}});
  EXPECT_NE(e.find("kernels.attention_forward = 'nope'"), std::string::npos) << e;
  EXPECT_NE(e.find("mask_off_by_one"), std::string::npos) << e;
}

TEST(Catalogue, APartnerComesAlongAndAConflictIsRefused) {
  Catalogue<float> cat = cpu_catalogue<float>();  // a copy: the shared one stays unpaired
  const auto fn = [&](const char* name) { return cat.attention_backward.find(name)->fn; };
  // Give the CPU's backward a second name, and pair a forward variant with it.
  cat.attention_backward.add("probabilities", fn("reference"), {"the same kernel", "", "", ""});
  cat.attention_forward.pair("mask_off_by_one", "attention_backward", "probabilities");

  const KernelSet<float> k = cat.select({{"attention_forward", "mask_off_by_one"}});
  EXPECT_EQ(k.attention_forward, cat.attention_forward.find("mask_off_by_one")->fn);
  EXPECT_EQ(k.attention_backward, fn("probabilities"));
  // Naming the partner itself is fine; naming another backward is refused, with both names.
  EXPECT_EQ(refusal(cat, {{"attention_forward", "mask_off_by_one"},
                          {"attention_backward", "probabilities"}}),
            "");
  const std::string e =
      refusal(cat, {{"attention_forward", "mask_off_by_one"}, {"attention_backward", "reference"}});
  EXPECT_NE(e.find("runs only with kernels.attention_backward = 'probabilities'"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("got 'reference'"), std::string::npos) << e;
  // The backward that reads probabilities needs a forward that saves them: alone it brings one
  // along; with a forward that names it as partner it is accepted; with another it is refused.
  cat.attention_forward.add("saving", cat.attention_forward.find("reference")->fn,
                            {"the same kernel", "", "", ""});
  cat.attention_forward.pair("saving", "attention_backward", "probabilities");
  cat.attention_backward.pair("probabilities", "attention_forward", "saving");
  EXPECT_EQ(cat.select({{"attention_backward", "probabilities"}}).attention_forward,
            cat.attention_forward.find("saving")->fn);
  EXPECT_EQ(refusal(cat, {{"attention_forward", "mask_off_by_one"},
                          {"attention_backward", "probabilities"}}),
            "");
  EXPECT_NE(
      refusal(cat, {{"attention_forward", "reference"}, {"attention_backward", "probabilities"}}),
      "");
  // Unpaired variants leave the other ops at their references; removing a variant drops its pair.
  EXPECT_EQ(cat.select({{"attention_forward", "no_max_subtraction"}}).attention_backward,
            fn("reference"));
  cat.attention_forward.remove("mask_off_by_one");
  EXPECT_EQ(cat.attention_forward.partner("mask_off_by_one"), nullptr);
}

}  // namespace divlab
