// nn_ops — the forward pass's element and row operations on device arrays (row-major binary32),
// each the CPU's operation (nn/norm.h, nn/activation.h, nn/attention.h RoPE) in its order, through
// the same MANTIS_HD element code; the sites' input / output roundings on their streams (streams.h).
// Queued on the stream. h (device memory, or null): the site's health (nn/site_health.h), counted
// as the CPU's operation counts it. Plain C++.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/cuda.h"  // AttentionKernel
#include "cuda/device.h"
#include "nn/policy.h"
#include "nn/site_health.h"

namespace mantis::gpu {

// x [T,C] = wte[tokens[t]] (+ wpe[t] when wpe is given: gpt2), tokens on the device.
void embed(const int32_t* tokens, const float* wte, const float* wpe, float* x, size_t T, size_t C, const Stream& s);
// out [T,C] = norm(x) at a norm site (b null: RMSNorm); x is left untouched. scratch [T,C] holds
// the rounded input when the site rounds it.
void norm(const SitePlan& p, uint64_t stream, const float* x, const float* w, const float* b, float eps, float* out,
          float* scratch, size_t T, size_t C, const Stream& s, SiteHealth* h = nullptr);
// x [n] ← GELU(x) at the gelu site.
void gelu(const SitePlan& p, uint64_t stream, bool tanh_approx, float* x, size_t n, const Stream& s,
          SiteHealth* h = nullptr);
// g [n] ← silu(g) ⊙ u at the silu site (u rounded in place too).
void silu(const SitePlan& p, uint64_t stream, float* g, float* u, size_t n, const Stream& s, SiteHealth* h = nullptr);
// x [n] += y [n].
void add(float* x, const float* y, size_t n, const Stream& s);
// RoPE on x [T, nh·HS] with the angles cos_, sin_ [T, HS/2] (attention.h rope_rotate).
void rope(float* x, size_t T, size_t nh, size_t HS, const float* cos_, const float* sin_, const Stream& s);
// One layer's causal attention with LAMP (cuda.h cuda_attention_forward) on device arrays q
// [T, NH·HS], k, v [T, NKV·HS] → out [T, NH·HS]; counts [NH, T] (device scratch) receives the
// per-row LAMP selections; returns their total; health: the three sites' (device memory), counted
// as nn/attention.cpp counts them. attention_check: its
// InputErrors, on the host, once per run (attention.cu).
void attention_check(const PolicyPlan& pol, int layer, size_t NH, size_t NKV, size_t HS, AttentionKernel kernel);
uint64_t attention(const PolicyPlan& pol, int layer, const float* q, const float* k, const float* v, size_t T, size_t NH,
                   size_t NKV, size_t HS, float* out, AttentionKernel kernel, uint64_t* counts, const Stream& s,
                   const AttentionHealth& health = {});
// dst [T, w] = columns c0 .. c0 + w of src [T, ld].
void columns(const float* src, size_t ld, size_t c0, float* dst, size_t T, size_t w, const Stream& s);

}  // namespace mantis::gpu
