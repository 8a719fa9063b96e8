// philox — counter-based random numbers (Philox4x32-10, Salmon et al., SC'11).
//
// Every random word is a pure function of (seed, stream, index): element i of a stream uses
// word i % 4 of the block philox(counter = {i/4 (lo, hi), stream (lo, hi)}, key = seed).
// Results therefore do not depend on thread count, chunking, or CPU vs GPU.
// Header code shared verbatim by C++ and CUDA.
#pragma once

#include <cstdint>

#include "core/hd.h"

namespace mantis {

struct Philox4 {
  uint32_t v[4];
};

MANTIS_HD Philox4 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3,
                                uint32_t k0, uint32_t k1) {
  for (int r = 0; r < 10; ++r) {
    const uint64_t p0 = uint64_t(0xD2511F53u) * c0;
    const uint64_t p1 = uint64_t(0xCD9E8D57u) * c2;
    const uint32_t hi0 = uint32_t(p0 >> 32), lo0 = uint32_t(p0);
    const uint32_t hi1 = uint32_t(p1 >> 32), lo1 = uint32_t(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return Philox4{{c0, c1, c2, c3}};
}

// The four random words for elements 4·block .. 4·block+3 of (seed, stream).
MANTIS_HD Philox4 random_block(uint64_t seed, uint64_t stream, uint64_t block) {
  return philox4x32_10(uint32_t(block), uint32_t(block >> 32), uint32_t(stream),
                       uint32_t(stream >> 32), uint32_t(seed), uint32_t(seed >> 32));
}

// The random word of one element.
MANTIS_HD uint32_t random_word(uint64_t seed, uint64_t stream, uint64_t index) {
  return random_block(seed, stream, index >> 2).v[index & 3];
}

// Packed random bits (as Blackwell's cvt.rs, which takes one 32-bit word for four 8-bit
// roundings): 2^pack roundings share a word. Rounding `index` takes word ⌊index / 2^pack⌋ shifted
// left by (index mod 2^pack)·32/2^pack, so its slot lies in the top bits, where sr reads its
// sr_bits (≤ 32/2^pack: sr_pack). Slot 0 is the word's top byte (pack = 2) or half (pack = 1);
// pack = 0 is random_word. Indices are taken mod 2^64 (round_array.h), so word indices run mod
// 2^(64 − pack).
MANTIS_HD uint32_t sr_word(uint64_t seed, uint64_t stream, uint64_t index, int pack) {
  const uint32_t w = random_word(seed, stream, index >> pack);
  return w << ((uint32_t(index) & ((1u << pack) - 1)) << (5 - pack));
}

// log2 of the roundings per word: 0 unpacked; packed, 2 for sr_bits ≤ 8, 1 for ≤ 16 (the caller
// has refused packed with sr_bits > 16: validate_sr_packed).
MANTIS_HD int sr_pack(int sr_bits, bool packed) { return !packed ? 0 : sr_bits <= 8 ? 2 : 1; }

// The k-th 64-bit random word of (seed, stream): words 2k (high half) and 2k + 1 (low half)
// (train.cpp's manifest calls it philox64).
MANTIS_HD uint64_t random_word64(uint64_t seed, uint64_t stream, uint64_t k) {
  return uint64_t(random_word(seed, stream, 2 * k)) << 32 | random_word(seed, stream, 2 * k + 1);
}

}  // namespace mantis
