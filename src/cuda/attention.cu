// cuda_attention — one layer's causal attention with LAMP on the GPU, as detail::attention_forward
// (nn/attention.h) computes it. The per-element, per-row and per-tile steps are nn/attention_row.h's
// MANTIS_HD functions (tests/test_lamp.cpp runs them serially against the CPU attention); this file
// adds the launch, the indexing, the workspaces and the shared memory.
//
// Every score y_ij is computed by one thread (attention_score) with the CPU call's semantics: the
// site's product (emulated: accumulate.h's steps and random-word indices, with the stream and the
// output index that site_gemm + gemm use for the same call: per query row when the attention
// sites are random, per 64-row block otherwise), ÷ √HS in binary32, the site's output rounding.
// LAMP's recomputed score likewise (attention_recomputed). So emulated scores are bit-identical to
// the CPU's; native binary32 ones are a sequential k loop here and Eigen's blocked GEMM there (a
// tolerance). The rules' binary64 exp and log are CUDA's here and the C library's there
// (attention_row.h): LAMP counts are exact up to comparisons within a few ulps of τ.
//
//   materialised (any rule): one thread block per (head, query row); the row's scores in global
//     memory [NH, T, T], selection (lamp_row_select), recompute, softmax (softmax_row) with the
//     site's input and output rounding, then P·V (one thread per output column, the CPU call's
//     depth, stream and indices). Probabilities bit-identical to the CPU's where the scores are;
//     the output too when attn.pv is emulated (native: a sequential sum against Eigen's).
//   flash (relaxed rule or no LAMP): one thread block per (head, query row); key tiles of
//     kTile, an online softmax (attention_row.h OnlineSoftmax) and the relaxed rule tile by tile
//     (RelaxedScan: candidates pruned against the running bound, decided exactly at the end). The
//     LAMP counts equal the CPU's (the same scores, the same rule); the output differs from the
//     CPU's by the summation order of the online softmax (a tolerance). Needs a native attn.pv and
//     no softmax output rounding (the probabilities are never formed), and no random control
//     (it needs the row's count before its draws).
//   Both read the values of keys 0..i only for row i where they are not all finite (attention_row.h
//   attention_values_finite: the materialised kernel flags such 64-row blocks first, as the CPU
//   multiplies their rows one at a time).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "common.cuh"
#include "cuda/nn_ops.h"
#include "cuda/health.h"
#include "cuda/cuda.h"  // not "cuda.h": that name is also the CUDA driver API header
#include "core/accumulate.h"
#include "core/error.h"
#include "core/philox.h"
#include "core/round.h"
#include "nn/attention_row.h"
#include "nn/streams.h"

namespace mantis {
namespace cuda_detail {

namespace {

constexpr unsigned kAttnThreads = 128;
constexpr int64_t kTile = 64;  // flash: keys per tile
constexpr size_t kFlashMaxHS = 8192;  // flash: HS floats of dynamic shared memory, + FlashShared, ≤ 48 KB

// The kernels' workspaces, kept between the calls of one host thread and only grown, so that a
// forward pass does not cudaMalloc / cudaFree (which synchronises the device) at every layer.
struct AttentionScratch {
  DeviceBuffer<float> scores, cy, px;
  DeviceBuffer<uint8_t> mark, v_nonfinite;
  DeviceBuffer<uint32_t> idx, cj, pj;
};
AttentionScratch& attention_scratch() {
  thread_local AttentionScratch s;
  return s;
}

// The call (attention_row.h AttentionArgs) and the kernels' outputs and workspaces.
struct Args {
  AttentionArgs a;
  float* out;         // [T, NH·HS]
  float* rows;        // materialised: [NH, T, T] scores, then probabilities
  uint8_t* mark;      // materialised LAMP: [NH, T, T]
  uint32_t* idx;      // materialised random control: [NH, T, T]
  uint32_t* cj;       // flash with LAMP: [NH, T, T] candidates' keys ..
  float* cy;          // .. and scores
  uint32_t* pj;       // flash: [NH, T, ld] keys waiting to enter the online softmax ..
  float* px;          // .. and their scores
  int64_t ld;         // flash: T with LAMP (its candidates may all wait), kTile without (one tile)
  uint64_t* counts;   // [NH, T] LAMP selections per row
  AttentionHealth health;  // device memory; null: not counted
};

// A block's threads count into their own SiteHealth (null pointers where nothing is counted) and
// add them at the end (health_add).
struct ThreadHealth {
  SiteHealth qk, sm, pv;
  SiteHealth *pqk = nullptr, *psm = nullptr, *ppv = nullptr;
  __device__ explicit ThreadHealth(const AttentionHealth& dst) {
    if (dst.qk) pqk = &qk;
    if (dst.softmax) psm = &sm;
    if (dst.pv) ppv = &pv;
  }
  __device__ void flush(const AttentionHealth& dst) const {
    health_add(dst.qk, qk), health_add(dst.softmax, sm), health_add(dst.pv, pv);
  }
};

__device__ double row_tau(const AttentionArgs& A, int64_t i) { return lamp_row_tau(A.tau, A.length_scaled, i); }

// flags [NKV, nblocks]: which 64-row blocks of the values hold a non-finite number (one thread each).
__global__ void value_blocks_kernel(const float* v, int64_t T, int64_t NKV, int64_t HS, uint8_t* flags) {
  const int64_t nb = (T + kAttentionQueryBlock - 1) / kAttentionQueryBlock;
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= NKV * nb) return;
  const int64_t g = e / nb, r0 = (e - g * nb) * kAttentionQueryBlock;
  const int64_t r1 = r0 + kAttentionQueryBlock < T ? r0 + kAttentionQueryBlock : T;
  flags[e] = attention_values_finite(v, NKV * HS, g * HS, HS, r0, r1) ? 0 : 1;
}

// Block (query i = blockIdx.x, head h = blockIdx.y): scores → LAMP → softmax → P·V.
__global__ void attention_materialised(Args W) {
  const AttentionArgs& A = W.a;
  const int64_t i = blockIdx.x, h = blockIdx.y, n = i + 1, row = h * A.T + i;
  int64_t r0, r1;
  attention_block(A, i, r0, r1);
  float* S = W.rows + row * A.T;  // [T]: row i's scores, then probabilities
  ThreadHealth th(W.health);
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) S[j] = attention_score(A, h, i, j, th.pqk);
  __syncthreads();
  if (A.lamp) {
    uint8_t* mark = W.mark + row * A.T;  // [n]
    if (threadIdx.x == 0) {
      uint32_t* idx = W.idx ? W.idx + row * A.T : nullptr;  // [n]
      W.counts[row] = lamp_row_select(A.strict_rule, row_tau(A, i), A.random_control, A.lamp_seed, S, size_t(n), mark,
                                      idx, lamp_stream(A.layer, h, i));
    }
    __syncthreads();
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
      if (mark[j]) S[j] = attention_recomputed(A, h, i, j);
    __syncthreads();
  }
  const uint64_t sms = softmax_stream(A.layer, h, i);
  if (A.sm_in.on)
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
      S[j] = round_element(A.sm_in, S[j], sms + kStreamA, uint64_t(j), th.psm);
  __syncthreads();
  if (threadIdx.x == 0) softmax_row(S, n);  // sequential: the CPU's order
  __syncthreads();
  for (int64_t j = threadIdx.x; j < r1; j += blockDim.x) {
    if (j < n && A.sm_out.on) S[j] = round_element(A.sm_out, S[j], sms + kStreamOutput, uint64_t(j), th.psm);
    if (j < n && th.psm) health_count_nonfinite(*th.psm, S[j]);
    if (j >= n) S[j] = 0;  // the masked probabilities (the block call's depth r1 reads them)
  }
  __syncthreads();
  for (int64_t c = threadIdx.x; c < A.HS; c += blockDim.x)
    W.out[i * A.NH * A.HS + h * A.HS + c] = attention_pv(A, S, h, i, c, th.ppv);
  th.flush(W.health);
}

// Flash: the keys in tiles; the online softmax fed in batches of ≤ kTile (key, score) pairs, whose
// scalar steps thread 0 takes in order and whose output updates the threads share by column.
struct FlashShared {
  float ys[kTile];      // a tile's scores
  float r[kTile], p[kTile];
  uint32_t bj[kTile];   // the batch's keys
  OnlineSoftmax<float> sm;
  RelaxedScan scan;
  int64_t npend;
  uint64_t count;
};

// Feeds the pending pairs (pj, px)[0..np) into the online softmax (the softmax's input rounding on
// the way, index j as the CPU). All threads call it.
__device__ void flash_flush(const AttentionArgs& A, FlashShared& sh, float* acc, const uint32_t* pj, const float* px,
                            int64_t np, int64_t h, int64_t i, SiteHealth* hsm) {
  const int64_t g = h / (A.NH / A.NKV);
  const uint64_t sms = softmax_stream(A.layer, h, i);
  for (int64_t b0 = 0; b0 < np; b0 += kTile) {
    const int64_t nb = np - b0 < kTile ? np - b0 : kTile;
    if (threadIdx.x == 0)
      for (int64_t t = 0; t < nb; ++t) {
        float x = px[b0 + t];
        const uint32_t j = pj[b0 + t];
        if (A.sm_in.on) x = round_element(A.sm_in, x, sms + kStreamA, j, hsm);
        online_softmax_step(sh.sm, x, sh.r[t], sh.p[t]);
        sh.bj[t] = j;
      }
    __syncthreads();
    for (int64_t c = threadIdx.x; c < A.HS; c += blockDim.x)
      for (int64_t t = 0; t < nb; ++t)
        online_softmax_apply(acc + c, sh.r[t], sh.p[t], A.v + int64_t(sh.bj[t]) * A.NKV * A.HS + g * A.HS + c, 1);
    __syncthreads();
  }
}

__global__ void attention_flash(Args W) {
  const AttentionArgs& A = W.a;
  MANTIS_DYNAMIC_SHARED(float, acc);  // [HS] the unnormalised output
  __shared__ __align__(16) unsigned char sh_raw[sizeof(FlashShared)];  // no constructors in __shared__
  FlashShared& sh = *reinterpret_cast<FlashShared*>(sh_raw);
  const int64_t i = blockIdx.x, h = blockIdx.y, n = i + 1, row = h * A.T + i;
  uint32_t *cj = A.lamp ? W.cj + row * A.T : nullptr, *pj = W.pj + row * W.ld;  // [n], [ld]
  float *cy = A.lamp ? W.cy + row * A.T : nullptr, *px = W.px + row * W.ld;
  const double tau = A.lamp ? row_tau(A, i) : 0.0;
  const int mode = A.lamp ? lamp_relaxed_trivial(tau) : 0;  // 0 none, 1 all, 2 by the keys
  ThreadHealth th(W.health);
  for (int64_t c = threadIdx.x; c < A.HS; c += blockDim.x) acc[c] = 0.0f;
  if (threadIdx.x == 0) sh.sm = OnlineSoftmax<float>{}, sh.scan = RelaxedScan{}, sh.npend = 0, sh.count = 0;
  __syncthreads();
  for (int64_t t0 = 0; t0 < n; t0 += kTile) {
    const int64_t nt = n - t0 < kTile ? n - t0 : kTile;
    for (int64_t t = threadIdx.x; t < nt; t += blockDim.x) {
      if (mode == 1) {  // every score recomputed; the site's own scores still counted, as the CPU does
        sh.ys[t] = attention_recomputed(A, h, i, t0 + t);
        if (th.pqk) (void)attention_score(A, h, i, t0 + t, th.pqk);
      } else {
        sh.ys[t] = attention_score(A, h, i, t0 + t, th.pqk);
      }
    }
    if (!MANTIS_PLANTED(kPlantFlashBarrier)) __syncthreads();
    if (threadIdx.x == 0) {
      if (mode == 2) {
        for (int64_t t = 0; t < nt; ++t) relaxed_scan_add(sh.scan, cj, cy, uint32_t(t0 + t), sh.ys[t]);
        int64_t np = 0;
        relaxed_scan_prune(sh.scan, cj, cy, tau, [&](uint32_t j, float y) { pj[np] = j, px[np] = y, ++np; });
        sh.npend = np;
      } else {
        for (int64_t t = 0; t < nt; ++t) pj[t] = uint32_t(t0 + t), px[t] = sh.ys[t];
        sh.npend = nt;
        if (mode == 1) sh.count += uint64_t(nt);
      }
    }
    __syncthreads();
    flash_flush(A, sh, acc, pj, px, sh.npend, h, i, th.psm);
  }
  __syncthreads();  // flash_flush has no barrier when nothing was pending: every read of sh.npend before it changes
  if (mode == 2) {
    if (threadIdx.x == 0) {
      int64_t np = 0;  // the decisions in candidate order: keys in pj, scores in px, selected in cy (1 / 0)
      sh.count = relaxed_scan_finish(sh.scan, cj, cy, tau, [&](uint32_t j, float y, bool sel) {
        pj[np] = j, px[np] = y, cy[np] = sel ? 1.0f : 0.0f, ++np;  // cy[np] was read already
      });
      sh.npend = np;
    }
    __syncthreads();
    for (int64_t c = threadIdx.x; c < sh.npend; c += blockDim.x)  // the selected candidates' recomputed scores
      if (cy[c] != 0.0f) px[c] = attention_recomputed(A, h, i, pj[c]);
    __syncthreads();
    flash_flush(A, sh, acc, pj, px, sh.npend, h, i, th.psm);
  }
  if (A.lamp && threadIdx.x == 0) W.counts[row] = sh.count;
  // The probabilities are never formed: the row's NaNs follow from the online sum (attention_row.h).
  if (th.psm && threadIdx.x == 0 && online_softmax_nan(sh.sm)) th.sm.nan += uint64_t(n);
  __syncthreads();
  float* o = W.out + i * A.NH * A.HS + h * A.HS;
  for (int64_t c = threadIdx.x; c < A.HS; c += blockDim.x) {
    online_softmax_finish(sh.sm, acc + c, o + c, 1);
    if (th.ppv) health_count_nonfinite(*th.ppv, o[c]);  // attn.pv is native here: no rounding to overflow
  }
  th.flush(W.health);
}

}  // namespace

void attention_validate(const PolicyPlan& pol, int l, size_t NH, size_t NKV, size_t HS, AttentionKernel kernel) {
  if (NH == 0 || NKV == 0 || HS == 0 || NH % NKV != 0)
    throw InputError("cuda attention: NH = " + std::to_string(NH) + ", NKV = " + std::to_string(NKV) + ", HS = " +
                     std::to_string(HS) + ": need NH, NKV, HS ≥ 1 and NKV dividing NH");  // (fmt: not under nvcc)
  const SitePlan &qk = pol.at(Site::attn_qk, l), &pv = pol.at(Site::attn_pv, l), &sm = pol.at(Site::softmax, l);
  for (const SitePlan* p : {&qk, &pv, &pol.lamp_scores()})
    if (p->input || p->input_a || p->input_b)
      throw InputError("cuda attention: operand rounding at attn.qk / attn.pv / the LAMP recompute is not supported");
  if (kernel == AttentionKernel::flash) {
    const std::optional<LampSpec>& lamp = pol.policy().lamp;
    if (lamp && (lamp->rule != LampRule::relaxed || lamp->random_control))
      throw InputError("cuda attention: the flash kernel takes the relaxed LAMP rule without random control");
    if (sm.output || !pv.is_native())
      throw InputError("cuda attention: the flash kernel needs a native attn.pv and no softmax output rounding");
    if (HS > kFlashMaxHS)  // a row's output lives in shared memory (48 KB without opting in)
      throw InputError("cuda attention: the flash kernel takes head sizes up to " + std::to_string(kFlashMaxHS) +
                       "; HS = " + std::to_string(HS) + " (use the materialised kernel)");
  }
}

void attention_device(const PolicyPlan& pol, int l, const float* q, const float* k, const float* v, size_t T,
                      size_t NH, size_t NKV, size_t HS, float* out, uint64_t* counts, float* probs,
                      AttentionKernel kernel, cudaStream_t cs, const AttentionHealth& health) {
  if (T == 0) return;
  Args W{};
  W.a = attention_args(pol, l, q, k, v, int64_t(T), int64_t(NH), int64_t(NKV), int64_t(HS));
  W.out = out, W.counts = counts, W.health = health;
  const size_t rows = NH * T * T;
  const dim3 grid{unsigned(T), unsigned(NH)};
  AttentionScratch& sc = attention_scratch();
  if (kernel == AttentionKernel::materialised) {
    W.rows = probs ? probs : at_least(sc.scores, rows);
    W.mark = W.a.lamp ? at_least(sc.mark, rows) : nullptr;
    W.idx = W.a.lamp && W.a.random_control ? at_least(sc.idx, rows) : nullptr;
    if (!W.a.by_row) {  // random sites go row by row anyway
      const size_t flags = NKV * ((T + kAttentionQueryBlock - 1) / kAttentionQueryBlock);
      uint8_t* f = at_least(sc.v_nonfinite, flags);
      cuda_detail::launch("value_blocks_kernel", value_blocks_kernel, unsigned((flags + 127) / 128), 128, 0, cs, v, int64_t(T), int64_t(NKV), int64_t(HS), f);
      MANTIS_CUDA_CHECK_LAUNCH();
      W.a.v_nonfinite = f;
    }
    MANTIS_CUDA_CHECK(cudaMemsetAsync(W.rows, 0, rows * sizeof(float), cs));  // the masked entries stay 0
    cuda_detail::launch("attention_materialised", attention_materialised, grid, kAttnThreads, 0, cs, W);
  } else {
    W.ld = W.a.lamp ? int64_t(T) : kTile;
    if (W.a.lamp) W.cj = at_least(sc.cj, rows), W.cy = at_least(sc.cy, rows);
    W.pj = at_least(sc.pj, NH * T * size_t(W.ld)), W.px = at_least(sc.px, NH * T * size_t(W.ld));
    cuda_detail::launch("attention_flash", attention_flash, grid, kAttnThreads, HS * sizeof(float), cs, W);
  }
  MANTIS_CUDA_CHECK_LAUNCH();
  MANTIS_CUDA_CHECK(cudaStreamSynchronize(cs));  // the scratch is this thread's next call's
}

}  // namespace cuda_detail

uint64_t cuda_attention_forward(const PolicyPlan& pol, int l, const float* q, const float* k, const float* v,
                                size_t T, size_t NH, size_t NKV, size_t HS, float* out, AttentionKernel kernel,
                                uint64_t* row_counts, float* probs) {
  using namespace cuda_detail;
  attention_validate(pol, l, NH, NKV, HS, kernel);
  if (probs && kernel != AttentionKernel::materialised)
    throw InputError("cuda attention: probabilities come from the materialised kernel only");
  if (T == 0) return 0;
  DeviceBuffer<float> dq(T * NH * HS), dk(T * NKV * HS), dv(T * NKV * HS), dout(T * NH * HS);
  DeviceBuffer<float> dprobs(probs ? NH * T * T : 0);
  DeviceBuffer<uint64_t> dcounts(NH * T);
  dq.upload(q, T * NH * HS), dk.upload(k, T * NKV * HS), dv.upload(v, T * NKV * HS);
  MANTIS_CUDA_CHECK(cudaMemset(dcounts.get(), 0, NH * T * sizeof(uint64_t)));
  attention_device(pol, l, dq.get(), dk.get(), dv.get(), T, NH, NKV, HS, dout.get(), dcounts.get(),
                   probs ? dprobs.get() : nullptr, kernel, 0);
  dout.download(out, T * NH * HS);
  if (probs) dprobs.download(probs, NH * T * T);
  std::vector<uint64_t> c(NH * T);
  dcounts.download(c.data(), NH * T);
  uint64_t total = 0;
  for (size_t r = 0; r < c.size(); ++r) total += c[r];
  if (row_counts) std::copy(c.begin(), c.end(), row_counts);
  return total;
}

void gpu::attention_check(const PolicyPlan& pol, int layer, size_t NH, size_t NKV, size_t HS, AttentionKernel kernel) {
  cuda_detail::attention_validate(pol, layer, NH, NKV, HS, kernel);
}

uint64_t gpu::attention(const PolicyPlan& pol, int layer, const float* q, const float* k, const float* v, size_t T,
                        size_t NH, size_t NKV, size_t HS, float* out, AttentionKernel kernel, uint64_t* counts,
                        const Stream& s, const AttentionHealth& health) {
  using namespace cuda_detail;
  if (T == 0) return 0;
  MANTIS_CUDA_CHECK(cudaMemsetAsync(counts, 0, NH * T * sizeof(uint64_t), native(s)));
  attention_device(pol, layer, q, k, v, T, NH, NKV, HS, out, counts, nullptr, kernel, native(s), health);
  std::vector<uint64_t> c(NH * T);
  copy_to_host(c.data(), counts, c.size() * sizeof(uint64_t));
  uint64_t total = 0;
  for (uint64_t x : c) total += x;
  return total;
}

}  // namespace mantis
