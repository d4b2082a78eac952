// What the torch side of the native kernels shares (module.cpp and the files it includes).
#pragma once
#include <torch/extension.h>
#include <ATen/Parallel.h>
