// Candidate variants of attention_forward.
#include <cmath>

#include "kernels/attention/attention.h"
#include "kernels/common/parallel.h"

namespace divlab {
namespace {

template <class T>
void mask_off_by_one(T* out, T* att, const T* qkv, int B, int T_, int C, int NH) {
  attention_forward_with(out, att, qkv, B, T_, C, NH, 1, true);
}
template <class T>
void no_max_subtraction(T* out, T* att, const T* qkv, int B, int T_, int C, int NH) {
  attention_forward_with(out, att, qkv, B, T_, C, NH, 0, false);
}
}  // namespace

template <class T>
void register_attention_variants(Catalogue<T>& cat) {
  cat.attention_forward.add(
      "mask_off_by_one", mask_off_by_one<T>,
      {"causal mask off by one: position i attends to 0..i+1",
       "every position sees the token it is trained to predict: training loss falls far below "
       "what the data allows, while the model learns nothing usable",
       "validation loss computed with the reference kernels (divlab always does): garbage",
       "training loss alone, which looks better than ever"});
  cat.attention_forward.add(
      "no_max_subtraction", no_max_subtraction<T>,
      {"softmax as exp(s) / sum exp(s), without subtracting the row max",
       "exp overflows to inf for scores above ~88 (fp32): inf / inf = NaN",
       "large attention scores: large weights, long training, high learning rates",
       "small scores (initialisation, Gaussian test inputs): identical to the reference up to "
       "rounding"});
}

template void register_attention_variants(Catalogue<float>&);
template void register_attention_variants(Catalogue<double>&);
}  // namespace divlab
