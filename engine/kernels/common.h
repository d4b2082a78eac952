// What the native CPU kernels share: the ISA switch and bf16 <-> float32 conversions.
#pragma once
#include <torch/extension.h>
#if defined(__AVX512F__) && defined(__AVX512BF16__) && defined(__AVX512BW__) && !defined(INFERLAB_PORTABLE)
#include <immintrin.h>
#define INFERLAB_AVX512_BF16 1
#endif
#if defined(INFERLAB_AVX512_BF16) && defined(__AVX512VNNI__)
#define INFERLAB_AVX512_VNNI 1  // integer dot products (vpdpbusd) for int8 activations
#endif
#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

static inline float bf16_to_float(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

static inline uint16_t float_to_bf16(float f) {  // round to nearest even, as torch does
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  if (std::isnan(f)) return 0x7fc0;
  bits += 0x7fff + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}
