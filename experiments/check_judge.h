// Judging one draw of `divlab check`: the variant's outputs against the fp64 reference's, and the
// verdict on a condition (experiments/check.cpp runs the draws; docs/kernel-authors.md states the
// criteria these implement).
#pragma once

#include <string>
#include <vector>

#include "experiments/check.h"
#include "kernels/op_cases.h"

namespace divlab {

// Normalised error every output must stay within: max|v - r| / max|r|, the verifier's scale.
constexpr double kTolerance = 1e-2;
// Every output within this: an fp32-grade kernel (the failure's name in the report: below).
constexpr double kFp32Grade = 1e-4;
inline constexpr const char* kFp32GradeCondition = "fp32 grade";
// The bf16 mode's fp32 outputs past the fp32 grade (CheckReport::fp32_outputs_required).
inline constexpr const char* kFp32OutputsCondition = "fp32 outputs";

// x in the reports' format (three significant digits, exponent).
std::string format_e(double x);

// Per output, twice the largest change that rounding the inputs makes to the exact result,
// relative to the output's largest value (its largest contribution, for an output the op adds
// into): error accepted beyond the bar where an honest kernel computing on rounded inputs would
// be past it (few elements, cancelling terms). `rounded`: the reference on the rounded inputs.
std::vector<double> rounding_allowance(const OpRun& ref, const OpRun& rounded,
                                       const std::vector<std::vector<double>>& initial,
                                       const std::vector<ArgSpec>& written);

// Which of the reference's outputs the NaNs planted in `x`'s inputs reach in exact arithmetic.
std::vector<std::vector<bool>> nan_reach(const std::string& op, const KernelSet<double>& reference,
                                         const OpInputs& x, const OpShape& s);

// Compares the variant's outputs (`got`) with the reference's into `r`: errors, the worst
// element, rows, bias. `allow` (per output) is error accepted beyond the bar; `nan_reach` is
// non-empty when the inputs hold NaNs.
void measure(ConditionResult& r, const OpRun& got, const OpRun& ref,
             const std::vector<std::vector<double>>& initial, const std::vector<ArgSpec>& written,
             const std::vector<double>& allow, const std::vector<std::vector<bool>>& nan_reach);

// The verdict on what measure() found (and on writes outside the outputs): r.failed and r.why.
void judge(ConditionResult& r);

// Two runs' outputs equal bit for bit (NaN's bits included).
bool bitwise_equal(const OpRun& a, const OpRun& b);

}  // namespace divlab
