// Candidate variants of RoPE: the three mistakes rotary kernels ship with. Each forward variant
// runs with its own backward (a kernel author writes the pair; Catalogue pairs them), so the
// gradients are those of the function the forward computes; the backward variant alone is a
// backward that disagrees with the reference forward.
#include "kernels/rope/rope.h"

namespace divlab {
namespace {

template <class T, const RopeScheme* scheme, int sign>
void rope_with(T* y, const T* x, int B, int T_, int NH, int NKV, int HD, T base) {
  rope_apply(y, x, B, T_, NH, NKV, HD, base, sign, *scheme);
}

template <class T, const RopeScheme* scheme>
void add_pair(Catalogue<T>& cat, const char* name, const VariantDoc& doc) {
  cat.rope_forward.add(name, rope_with<T, scheme, +1>, doc);
  cat.rope_backward.add(name, rope_with<T, scheme, -1>, doc);
  cat.rope_forward.pair(name, "rope_backward", name);
}
}  // namespace

template <class T>
void register_rope_variants(Catalogue<T>& cat) {
  add_pair<T, &kRopeBase10000>(
      cat, "base_10000",
      {"the frequency base hard-coded to 10000 (llama 1 and 2's) instead of the model's",
       "every pair but the first rotates at the wrong frequency: a model trained with base "
       "500000 (llama 3) reads positions it was never trained on",
       "a base other than 10000 (model.rope_base); loading weights trained with the right base",
       "models configured with base 10000; training from scratch with the kernel on both sides "
       "(any base is a valid rotary encoding)"});
  add_pair<T, &kRopeInterleaved>(
      cat, "interleaved_pairs",
      {"rotates channel pairs (2i, 2i + 1) (GPT-J / Meta's complex form) instead of (i, i + HD/2)",
       "a different permutation of the head's channels: q . k changes at every position but 0",
       "any sequence longer than one; weights converted between the two layouts",
       "position 0 (no rotation); training from scratch with the kernel on both sides (the "
       "pairing is a fixed permutation the projections can learn)"});
  add_pair<T, &kRopePositionPlusOne>(
      cat, "position_plus_one",
      {"positions counted from 1: row t rotates by (t + 1) theta",
       "every rotation is off by one step: the output differs from the reference everywhere",
       "comparing outputs with the reference (q and k alone, or a cache of keys rotated by "
       "another kernel)",
       "attention itself: q and k both shift, and q . k depends only on their difference"});
}

template void register_rope_variants(Catalogue<float>&);
template void register_rope_variants(Catalogue<double>&);
}  // namespace divlab
