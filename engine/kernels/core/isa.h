// The ISA tier this translation unit is compiled for, and what every body shares. No torch here: the
// core headers (core/*.h) build on their own, so a plain C++ harness (harness/check_kernels.cpp) runs
// them under qemu for Arm and against the scalar reference on any CPU.
//
// One build per tier, like ggml's CPU variants (engine/kernels/tier_choice.py picks, per kernel family, the
// fastest tier this CPU runs, timed at the first build):
//   avx512    AVX-512 F/BW/VL with bf16 dot products (vdpbf16ps) and VNNI (vpdpbusd): Zen 4+, Sapphire Rapids+
//   avx2      AVX2 + FMA + F16C: Intel since Haswell (laptops since 12th gen have no AVX-512), AMD before Zen 4
//   neon      AArch64 Advanced SIMD, with sdot/udot (vdotq_s32) where __ARM_FEATURE_DOTPROD
//   portable  plain C++ (what any other CPU runs; INFERLAB_PORTABLE forces it on any compiler flags)
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#if defined(INFERLAB_PORTABLE)
#define INFERLAB_TIER "portable"
#elif defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512BF16__) && \
    defined(__AVX512VNNI__)
#include <immintrin.h>
#define INFERLAB_AVX512_BF16 1
#define INFERLAB_AVX512_VNNI 1  // integer dot products (vpdpbusd) for int8 activations
#define INFERLAB_TIER "avx512"
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define INFERLAB_AVX2 1
#define INFERLAB_TIER "avx2"
#elif defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>
#define INFERLAB_NEON 1
#if defined(__ARM_FEATURE_DOTPROD)
#define INFERLAB_NEON_DOT 1  // sdot: four int8 products summed into each int32 lane
#endif
#define INFERLAB_TIER "neon"
#else
#define INFERLAB_TIER "portable"
#endif

#if defined(INFERLAB_AVX2) || defined(INFERLAB_NEON)
#define INFERLAB_SIMD8 1  // the 8-lane float bodies of core/simd8.h
#endif

namespace inferlab {

inline const char* tier_name() { return INFERLAB_TIER; }

inline float bf16_to_float(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

inline uint16_t float_to_bf16(float f) {  // round to nearest even, as torch does
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  if (std::isnan(f)) return 0x7fc0;
  bits += 0x7fff + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

// Bytes ahead in the weight stream the bodies ask for (software prefetch): a decode step's weights come
// from memory, not from cache, and the hardware prefetcher alone leaves the core waiting on them
// (measured in the fused step, one thread, SmolLM2 at 4 bits, AVX-512: 12.6 ms per step without; 1, 2, 4,
// 8 KiB ahead: 8.8, 7.0-8.1, 5.0-7.5, 6.9-7.2 ms on a shared 2-core machine, where runs vary by a third).
#ifndef INFERLAB_PREFETCH_BYTES
#define INFERLAB_PREFETCH_BYTES 4096
#endif
static constexpr int64_t kPrefetch = INFERLAB_PREFETCH_BYTES;
inline void prefetch(const void* p) {
  if (kPrefetch > 0) __builtin_prefetch(static_cast<const char*>(p) + kPrefetch, 0, 3);
}

// One cache line into L1 or into L2 only, no offset added: for streams that choose their own distance.
inline void prefetch_l1(const void* p) { __builtin_prefetch(p, 0, 3); }
inline void prefetch_l2(const void* p) { __builtin_prefetch(p, 0, 2); }

inline int log2_exact(int64_t v) {
  int s = 0;
  while ((int64_t{1} << s) < v) ++s;
  return s;
}

}  // namespace inferlab
