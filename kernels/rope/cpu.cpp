#include "kernels/rope/rope.h"

namespace divlab {

template <class T>
void register_rope(Catalogue<T>& cat) {
  cat.rope_forward.what = "rotary position embedding of q and k (half-split pairs), v copied";
  cat.rope_forward.add("reference", rope_forward_reference<T>,
                       {"angles in double, rotation in working precision", "", "", ""});
  cat.rope_backward.what = "RoPE backward: the inverse rotation";
  cat.rope_backward.add("reference", rope_backward_reference<T>,
                        {"angles in double, rotation in working precision", "", "", ""});
}

template void register_rope(Catalogue<float>&);
template void register_rope(Catalogue<double>&);
}  // namespace divlab
