// `divlab check OP=VARIANT --train`: after the stress table, a short training grid chosen for
// the op's kind of error, with the candidate, the reference and the op's benign controls (the
// noise floor), and one sentence saying what the candidate did to training.
//
// The grid per op (a switch over the op list, so a new op must be given one):
//   gathers or scatters by token id (embedding_forward, embed_rmsnorm_backward)
//       configs/reproduce.toml --quick: Markov chains with and without hot ids (the dose that
//       breaks a row's accumulation), SGD and AdamW (which hides scale errors)
//   every other op
//       configs/check-train.toml: sizes no tile divides, the skewed chain, SGD and AdamW with
//       gradient clipping; an optimizer update only under its own optimizer (sgd_step, adamw_step),
//       the bf16 weight copy (cast) in bf16 mode, where the trainer calls it, the gradient
//       reduction (grad_reduce) over four simulated data-parallel ranks without clipping
#pragma once

#include <string>
#include <vector>

#include "analysis/verdicts.h"
#include "kernels/backend.h"
#include "kernels/op_list.h"

namespace divlab {

struct CheckTrainGrid {
  std::string base;  // the grid file it starts from (a resource path)
  bool quick;        // apply its [quick] overlay
  std::string text;  // the grid to run: the base with the kernels axis and the changes above
};

// `arms`: the kernels axis for `op` (reference first), trained on `backend` in `precision`'s
// mode (the mode check judged them in; the weight copy's grid is the bf16 mode's either way).
// Throws InputError if the base is unreadable.
CheckTrainGrid check_train_grid(Op op, const std::vector<std::string>& arms, Backend backend,
                                Precision precision, const std::vector<std::string>& plugins);

// One sentence from the grid's verdicts about `candidate` ("op=variant"), and a note on any
// control that moved.
std::string train_summary(const std::string& candidate, const std::vector<Verdict>& verdicts);

}  // namespace divlab
