// site — the named operations of the two graphs (policy.h describes each), the three GEMMs of a
// GEMM site, and the four projection units of a layer. Plain enums: the CUDA twin includes this.
#pragma once

#include <cstdint>

namespace mantis {

enum class Site : uint8_t { attn_qkv, attn_qk, attn_pv, attn_proj, mlp_fc, mlp_proj, lm_head, ln, softmax, gelu, silu };
constexpr int kSiteCount = 11;

// Which GEMM of a site: the forward product, or one of its two backward products.
enum class Pass : uint8_t { forward, dx, dw };
constexpr int kPassCount = 3;

// A unit is a projection site of one layer whose saved activation (its first operand) the
// backward pass may quantise (backward.h); its value indexes per-layer arrays (layer·kUnitCount
// + unit) and random streams, so it is numbered 0..3 and maps onto its Site.
enum class Unit : uint8_t { qkv, proj, fc, down };
constexpr int kUnitCount = 4;
constexpr Site site_of(Unit u) {
  constexpr Site s[kUnitCount] = {Site::attn_qkv, Site::attn_proj, Site::mlp_fc, Site::mlp_proj};
  return s[int(u)];
}

}  // namespace mantis
