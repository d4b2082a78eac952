// What the torch side of the native kernels shares (module.cpp and the files it includes).
#pragma once
// Only the headers the kernels use, not <torch/extension.h> (all of torch's C++ API): parsing that took
// 30 of the 42 s one tier's build took on a 2-core Zen 4; these take ~13 s.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/csrc/utils/pybind.h>

#include "threads.h"

namespace torch {  // the names the kernels spell torch::, as <torch/extension.h> would give them
using at::dtype;
using at::empty;
using at::empty_like;
using at::kBFloat16;
using at::Tensor;
constexpr auto kFloat32 = at::kFloat;  // as torch/types.h spells them
constexpr auto kInt64 = at::kLong;
constexpr auto kUInt8 = at::kByte;
}  // namespace torch
