"""CPU kernels for the step's memory-bound parts: RMSNorm, SiLU-times-up, RoPE with the
K/V cache write, paged attention for rows that attend through a block table in place,
and, in bfloat16 on AMX, the layers' projections (``tile_linear``).

Why: at decode sizes each of these is a few microseconds of work behind tens of
microseconds of op dispatch, and paged attention written with torch ops must first copy
the gathered blocks (read, write, read again), which tripled the KV traffic of a decode
step. These kernels read each K/V row once, straight from the pool. oneDNN's matmul
waited on the weights from memory at decode sizes; ``tile_linear`` streams them with
prefetching (decode steps 20-30% faster, see its comment).

They are plain C++ (no torch headers, so a build takes a couple of seconds), compiled on
first use with the system compiler for this machine's instruction set and cached under
``<cache_dir>/torch_executor/kernels/`` keyed by source, flags and CPU; loaded through
``ctypes``, which releases the GIL during a call. They link OpenMP by the soname torch's
own runtime carries, so they share torch's thread pool. Where no compiler is found, or
the build fails, ``load_kernels`` returns ``None`` and callers use the torch ops instead.

Numerics: float32 accumulation everywhere; in bfloat16, RMSNorm, RoPE and SiLU round
where transformers' bfloat16 graph rounds (RMSNorm and RoPE match it bit for bit, but
for values below 2^-126, which flush to zero); attention keeps its scores and
probabilities in float32 (transformers rounds them to bfloat16), which is closer to the
float32 model; projections sum exact products in float32 and round once.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from plugins.torch_executor.linear import Linear
from plugins.torch_executor.model import Ops

# Bump to force a rebuild when the calling convention changes without a source change.
ABI_VERSION = 1
COMPILE_FLAGS = (
    "-O3",
    "-march=native",
    "-mprefer-vector-width=512",
    "-fopenmp",
    "-shared",
    "-fPIC",
    "-std=c++17",
)

SOURCE = r"""
#include <cstdint>
#include <cstring>
#include <cmath>
#include <vector>
#include <algorithm>
#include <type_traits>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

typedef uint16_t bf16;

static inline float to_f(float x) { return x; }
static inline float to_f(bf16 x) { return __builtin_bit_cast(float, (uint32_t)x << 16); }
template <typename T> static inline T from_f(float x);
template <> inline float from_f<float>(float x) { return x; }
template <> inline bf16 from_f<bf16>(float x) {
    // Round to nearest even, as torch's float -> bfloat16 cast (inputs here are finite).
    uint32_t u = __builtin_bit_cast(uint32_t, x);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (bf16)(u >> 16);
}
// Round through T: identity for float, one bfloat16 rounding otherwise.
template <typename T> static inline float rnd(float x) { return to_f(from_f<T>(x)); }

// exp for softmax: Cephes' single-precision polynomial after range reduction (about 1
// ulp), branch-free so the compiler vectorises the loops that call it; exactly 0 below
// -87 (masked keys).
static inline float fast_exp(float x) {
    const float xc = std::min(std::max(x, -87.0f), 88.0f);
    const float n = std::floor(xc * 1.44269504088896341f + 0.5f);
    const float r = xc - n * 0.693359375f + n * 2.12194440e-4f;
    float y = 1.9875691500e-4f;
    y = y * r + 1.3981999507e-3f;
    y = y * r + 8.3334519073e-3f;
    y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f;
    y = y * r + 5.0000001201e-1f;
    y = y * r * r + r + 1.0f;
    const float e = y * __builtin_bit_cast(float, ((int32_t)n + 127) << 23);
    return x < -87.0f ? 0.0f : e;
}

#if defined(__AVX512F__)
// 16 floats at a time: loads widen bfloat16, stores round to nearest even.
static inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
static inline __m512 load16(const bf16* p) {
    __m512i u = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
}

static inline __m512 exp512(__m512 x) {
    const __m512 xc = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
    const __m512 n = _mm512_roundscale_ps(
        _mm512_fmadd_ps(xc, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)),
        _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), xc);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
    __m512 y = _mm512_set1_ps(1.9875691500e-4f);
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    const __m512 result = _mm512_scalef_ps(y, n);  // y * 2^n, exact: n is in [-126, 127]
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_GE_OQ), result);
}

static inline void store16(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
// 16 floats to bfloat16, rounded to nearest even. With AVX512-BF16 one instruction does it
// (the elementwise kernels were bound by the two vector ports, and this saved 5 of their
// instructions per 16 values); it flushes values below 2^-126 to zero, where torch's
// cast keeps them as bfloat16 denormals.
static inline __m256i to_bf16(__m512 v) {
#if defined(__AVX512BF16__)
    return reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v));
#else
    const __m512i u = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
#endif
}
static inline void store16(bf16* p, __m512 v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), to_bf16(v));
}
// Round through T: identity for float, one bfloat16 rounding (to nearest even) otherwise.
template <typename T> static inline __m512 round16(__m512 v) {
    if constexpr (std::is_same_v<T, float>) {
        return v;
    } else {
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(to_bf16(v)), 16));
    }
}
#endif

// out[r] = rnd(w * rnd(x[r] / rms(x[r]))), as transformers' LlamaRMSNorm.
template <typename T>
static void rms_norm(const T* x, const T* w, T* out, int64_t rows, int64_t dim, float eps,
                     int threads) {
    #pragma omp parallel for num_threads(threads) if (rows >= 16)
    for (int64_t r = 0; r < rows; ++r) {
        const T* xr = x + r * dim;
        T* o = out + r * dim;
        int64_t d0 = 0;
        float ss = 0.f;
#if defined(__AVX512F__)
        __m512 acc = _mm512_setzero_ps();
        for (; d0 + 16 <= dim; d0 += 16) {
            const __m512 v = load16(xr + d0);
            acc = _mm512_fmadd_ps(v, v, acc);
        }
        ss = _mm512_reduce_add_ps(acc);
#endif
        for (int64_t d = d0; d < dim; ++d) { float v = to_f(xr[d]); ss += v * v; }
        const float inv = 1.0f / std::sqrt(ss / (float)dim + eps);
        int64_t d = 0;
#if defined(__AVX512F__)
        const __m512 iv = _mm512_set1_ps(inv);
        for (; d + 16 <= dim; d += 16)
            store16(o + d, _mm512_mul_ps(load16(w + d), round16<T>(_mm512_mul_ps(load16(xr + d), iv))));
#endif
        for (; d < dim; ++d) o[d] = from_f<T>(to_f(w[d]) * rnd<T>(to_f(xr[d]) * inv));
    }
}

// x: [rows, 2 inter] (gate, then up) -> out [rows, inter] = rnd(rnd(silu(gate)) * up), as
// transformers' LlamaMLP rounds in bfloat16.
template <typename T>
static void silu_mul(const T* x, T* out, int64_t rows, int64_t inter, int threads) {
    #pragma omp parallel for num_threads(threads) if (rows >= 8)
    for (int64_t r = 0; r < rows; ++r) {
        const T* gate = x + r * 2 * inter;
        const T* up = gate + inter;
        T* o = out + r * inter;
        int64_t i = 0;
#if defined(__AVX512F__)
        for (; i + 16 <= inter; i += 16) {
            const __m512 g = load16(gate + i);
            const __m512 e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), g));
            // 1 / (1 + e) by a reciprocal estimate and one Newton step (~1 ulp): a
            // vector divide was the loop's bottleneck.
            const __m512 den = _mm512_add_ps(_mm512_set1_ps(1.0f), e);
            __m512 rc = _mm512_rcp14_ps(den);
            rc = _mm512_mul_ps(rc, _mm512_fnmadd_ps(den, rc, _mm512_set1_ps(2.0f)));
            const __m512 act = round16<T>(_mm512_mul_ps(g, rc));
            store16(o + i, _mm512_mul_ps(act, load16(up + i)));
        }
#endif
        for (; i < inter; ++i) {
            const float g = to_f(gate[i]);
            o[i] = from_f<T>(rnd<T>(g / (1.0f + std::exp(-g))) * to_f(up[i]));
        }
    }
}

// Rotate-half RoPE of one head: out = rnd(rnd(x * cos) + rnd(rotate_half(x) * sin)).
template <typename T>
static inline void rope_head(const T* x, const T* c, const T* s, T* out, int64_t hd) {
    const int64_t half = hd / 2;
    int64_t d = 0;
#if defined(__AVX512F__)
    for (; d + 16 <= half; d += 16) {
        const __m512 x1 = load16(x + d), x2 = load16(x + half + d);
        const __m512 c1 = load16(c + d), c2 = load16(c + half + d);
        const __m512 s1 = load16(s + d), s2 = load16(s + half + d);
        const __m512 neg = _mm512_sub_ps(_mm512_setzero_ps(), x2);
        store16(out + d, _mm512_add_ps(round16<T>(_mm512_mul_ps(x1, c1)), round16<T>(_mm512_mul_ps(neg, s1))));
        store16(out + half + d,
                _mm512_add_ps(round16<T>(_mm512_mul_ps(x2, c2)), round16<T>(_mm512_mul_ps(x1, s2))));
    }
#endif
    for (; d < half; ++d) {
        out[d] = from_f<T>(rnd<T>(to_f(x[d]) * to_f(c[d])) + rnd<T>(-to_f(x[d + half]) * to_f(s[d])));
        out[half + d] = from_f<T>(rnd<T>(to_f(x[half + d]) * to_f(c[half + d])) +
                                  rnd<T>(to_f(x[d]) * to_f(s[half + d])));
    }
}

// qkv: [n, (heads + 2 kv_heads) hd] -> q_out [n, heads, hd] with RoPE; K (RoPE) written
// into k [kv_heads, num_blocks, hd, bs] and V into v [kv_heads, num_blocks, bs, hd] at
// slots[r] (block slots[r] / bs, offset slots[r] % bs); also the rotated K into k_out
// [n, kv_heads, hd] unless it is null. hd <= 512.
template <typename T>
static void rope_store(const T* qkv, const int64_t* positions, const T* cos, const T* sin,
                       const int64_t* slots, T* k, T* v, T* q_out, T* k_out, int64_t n,
                       int64_t heads, int64_t kv_heads, int64_t hd, int64_t num_blocks,
                       int64_t bs, int threads) {
    const int64_t stride = (heads + 2 * kv_heads) * hd;
    const int64_t head_stride = num_blocks * bs * hd;
    #pragma omp parallel for num_threads(threads) if (n >= 16)
    for (int64_t r = 0; r < n; ++r) {
        if (r + 1 < n) {
            // The next row's slots, for writing: its K column touches a line every
            // 64 bytes / (bs elements) of head dims, each a miss to memory (the block was
            // last written a step ago), so the misses overlap this row's RoPE.
            const int64_t nb = slots[r + 1] / bs, no = slots[r + 1] % bs;
            const int64_t every = std::max<int64_t>(1, 64 / (bs * (int64_t)sizeof(T)));
            for (int64_t h = 0; h < kv_heads; ++h) {
                const T* kt = k + h * head_stride + nb * hd * bs + no;
                for (int64_t d = 0; d < hd; d += every) __builtin_prefetch(kt + d * bs, 1, 3);
                __builtin_prefetch(v + h * head_stride + (nb * bs + no) * hd, 1, 3);
            }
        }
        const T* row = qkv + r * stride;
        const T* c = cos + positions[r] * hd;
        const T* s = sin + positions[r] * hd;
        const int64_t block = slots[r] / bs, offset = slots[r] % bs;
        for (int64_t h = 0; h < heads; ++h) rope_head(row + h * hd, c, s, q_out + (r * heads + h) * hd, hd);
        T rotated[512];
        for (int64_t h = 0; h < kv_heads; ++h) {
            T* kr = k_out ? k_out + (r * kv_heads + h) * hd : rotated;
            rope_head(row + (heads + h) * hd, c, s, kr, hd);
            T* kt = k + h * head_stride + block * hd * bs + offset;
            for (int64_t d = 0; d < hd; ++d) kt[d * bs] = kr[d];
            std::memcpy(v + h * head_stride + (block * bs + offset) * hd,
                        row + (heads + kv_heads + h) * hd, hd * sizeof(T));
        }
    }
}

// One row of q against one KV head. The `group` query heads that share it are done
// together, so each K/V row is read once; K blocks are stored transposed ([hd, bs]), so
// the scores of a block's tokens accumulate lane-wise with no horizontal sums. G, HD and
// BS fixed at compile time keep q, the scores and the accumulators in registers; 0 means
// "given at run time" (the general version).
template <typename T, int G_, int HD_, int BS_>
static void attend_row(const T* q, const T* kbase, const T* vbase, const int64_t* table,
                       int64_t len, float scale, int64_t group_rt, int64_t hd_rt, int64_t bs_rt,
                       float* scratch, int64_t max_len, T* out) {
    const int64_t G = G_ ? G_ : group_rt;
    const int64_t HD = HD_ ? HD_ : hd_rt;
    const int64_t BS = BS_ ? BS_ : bs_rt;
    const int64_t padded = (max_len + BS - 1) / BS * BS;
    float* qf = scratch;                 // [G, HD]
    float* acc = qf + G * HD;            // [G, HD]
    float* scores = acc + G * HD;        // [G, padded]
    for (int64_t g = 0; g < G; ++g) {
        #pragma omp simd
        for (int64_t d = 0; d < HD; ++d) qf[g * HD + d] = to_f(q[g * HD + d]) * scale;
    }
    // Whole blocks: slots past len hold finite numbers (the pool is zero-filled); their
    // scores are overwritten with -inf-like values so softmax gives them exactly 0.
    const int64_t padded_len = (len + BS - 1) / BS * BS;
    for (int64_t t0 = 0; t0 < len; t0 += BS) {
        const T* kt = kbase + table[t0 / BS] * HD * BS;
        for (int64_t g = 0; g < G; ++g) {
            if constexpr (BS_ > 0) {
                float s[BS_] = {};  // in registers: one vector per block for BS = 16
                for (int64_t d = 0; d < HD; ++d) {
                    const float qd = qf[g * HD + d];
                    #pragma omp simd
                    for (int64_t i = 0; i < BS_; ++i) s[i] += qd * to_f(kt[d * BS_ + i]);
                }
                float* dst = scores + g * padded + t0;
                #pragma omp simd
                for (int64_t i = 0; i < BS_; ++i) dst[i] = s[i];
            } else {
                float* s = scores + g * padded + t0;
                for (int64_t i = 0; i < BS; ++i) s[i] = 0.f;
                for (int64_t d = 0; d < HD; ++d) {
                    const float qd = qf[g * HD + d];
                    for (int64_t i = 0; i < BS; ++i) s[i] += qd * to_f(kt[d * BS + i]);
                }
            }
        }
    }
    for (int64_t g = 0; g < G; ++g) {
        float* sg = scores + g * padded;
        for (int64_t t = len; t < padded_len; ++t) sg[t] = -1e30f;
        float mx = sg[0];
        #pragma omp simd reduction(max : mx)
        for (int64_t t = 0; t < padded_len; ++t) mx = std::max(mx, sg[t]);
        float sum = 0.f;
        #pragma omp simd reduction(+ : sum)
        for (int64_t t = 0; t < padded_len; ++t) {
            const float e = fast_exp(sg[t] - mx);
            sg[t] = e;
            sum += e;
        }
        const float inv = 1.0f / sum;
        #pragma omp simd
        for (int64_t t = 0; t < padded_len; ++t) sg[t] *= inv;
    }
    for (int64_t j = 0; j < G * HD; ++j) acc[j] = 0.f;
    for (int64_t t0 = 0; t0 < len; t0 += BS) {
        const T* vb = vbase + table[t0 / BS] * BS * HD;
        const int64_t m = std::min(BS, len - t0);
        for (int64_t i = 0; i < m; ++i) {
            const T* v = vb + i * HD;
            for (int64_t g = 0; g < G; ++g) {
                const float p = scores[g * padded + t0 + i];
                #pragma omp simd
                for (int64_t d = 0; d < HD; ++d) acc[g * HD + d] += p * to_f(v[d]);
            }
        }
    }
    for (int64_t g = 0; g < G; ++g) {
        #pragma omp simd
        for (int64_t d = 0; d < HD; ++d) out[g * HD + d] = from_f<T>(acc[g * HD + d]);
    }
}

#if defined(__AVX512F__)
// The same computation with AVX-512 for 16-token blocks: a block's 16 scores of one query
// head are one register, so K^T rows need no horizontal sums, and softmax runs online
// (running max and sum per head), so K and V of a block are read once, in one pass.
template <typename T, int G, int HD>
static void attend_row_avx512(const T* q, const T* kbase, const T* vbase, const int64_t* table,
                              int64_t len, float scale, int64_t, int64_t, int64_t, float*,
                              int64_t, T* out) {
    constexpr int BS = 16, V = HD / 16;
    __m512 qv[G][V], acc[G][V];
    float m[G], l[G];
    for (int g = 0; g < G; ++g) {
        for (int j = 0; j < V; ++j) {
            qv[g][j] = _mm512_mul_ps(load16(q + g * HD + j * 16), _mm512_set1_ps(scale));
            acc[g][j] = _mm512_setzero_ps();
        }
        m[g] = -INFINITY;
        l[g] = 0.f;
    }
    alignas(64) float qs[G][HD];
    for (int g = 0; g < G; ++g)
        for (int j = 0; j < V; ++j) _mm512_store_ps(qs[g] + j * 16, qv[g][j]);
    alignas(64) float p[G][BS];
    for (int64_t t0 = 0; t0 < len; t0 += BS) {
        const int64_t block = table[t0 / BS];
        const T* kt = kbase + block * HD * BS;
        const T* vb = vbase + block * BS * HD;
        const int valid = (int)std::min<int64_t>(BS, len - t0);
        const __mmask16 mask = (__mmask16)((1u << valid) - 1u);
        // Blocks are scattered, so the hardware prefetcher cannot see the next one: its
        // lines are prefetched a few per step of the QK loop below (the last block
        // prefetches itself, which costs nothing). Issued all at once, the prefetches
        // stalled on the core's fill buffers with no work left to overlap them.
        const int64_t next = t0 + BS < len ? table[t0 / BS + 1] : block;
        const char* nk = reinterpret_cast<const char*>(kbase + next * HD * BS);
        const char* nv = reinterpret_cast<const char*>(vbase + next * BS * HD);
        // P partial sums per head over interleaved d: one sum would be a chain of HD
        // dependent FMAs, whose latency (not the FMA rate) then set a block's time.
        constexpr int P = G == 1 ? 4 : 2;
        constexpr int LINES = HD * BS * (int)sizeof(T) / 64;  // per K (and per V) block
        constexpr int PER_STEP = (LINES + HD / P - 1) / (HD / P);
        int line = 0;
        __m512 s[G], part[G][P];
        for (int g = 0; g < G; ++g)
            for (int j = 0; j < P; ++j) part[g][j] = _mm512_setzero_ps();
        for (int d = 0; d < HD; d += P) {
            for (int q = 0; q < PER_STEP && line < LINES; ++q, ++line) {
                _mm_prefetch(nk + line * 64, _MM_HINT_T0);
                _mm_prefetch(nv + line * 64, _MM_HINT_T0);
            }
            for (int j = 0; j < P; ++j) {
                const __m512 kd = load16(kt + (d + j) * BS);
                for (int g = 0; g < G; ++g)
                    part[g][j] = _mm512_fmadd_ps(_mm512_set1_ps(qs[g][d + j]), kd, part[g][j]);
            }
        }
        for (int g = 0; g < G; ++g) {
            s[g] = part[g][0];
            for (int j = 1; j < P; ++j) s[g] = _mm512_add_ps(s[g], part[g][j]);
        }
        // Rescale factors exp(old max - new max) of all heads in one vector exp.
        alignas(64) float shift[16] = {}, alpha[16];
        float m_new[G];
        for (int g = 0; g < G; ++g) {
            s[g] = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), mask, s[g]);
            m_new[g] = std::max(m[g], _mm512_reduce_max_ps(s[g]));
            shift[g] = m[g] - m_new[g];  // -inf on the first block: alpha 0
        }
        _mm512_store_ps(alpha, exp512(_mm512_load_ps(shift)));
        for (int g = 0; g < G; ++g) {
            const __m512 pg = exp512(_mm512_sub_ps(s[g], _mm512_set1_ps(m_new[g])));
            l[g] = l[g] * alpha[g] + _mm512_reduce_add_ps(pg);
            m[g] = m_new[g];
            const __m512 av = _mm512_set1_ps(alpha[g]);
            for (int j = 0; j < V; ++j) acc[g][j] = _mm512_mul_ps(acc[g][j], av);
            _mm512_store_ps(p[g], pg);
        }
        for (int i = 0; i < valid; ++i) {
            __m512 vv[V];
            for (int j = 0; j < V; ++j) vv[j] = load16(vb + i * HD + j * 16);
            for (int g = 0; g < G; ++g) {
                const __m512 pi = _mm512_set1_ps(p[g][i]);
                for (int j = 0; j < V; ++j) acc[g][j] = _mm512_fmadd_ps(pi, vv[j], acc[g][j]);
            }
        }
    }
    for (int g = 0; g < G; ++g) {
        alignas(64) float o[HD];
        const __m512 inv = _mm512_set1_ps(1.0f / l[g]);
        for (int j = 0; j < V; ++j) _mm512_store_ps(o + j * 16, _mm512_mul_ps(acc[g][j], inv));
        for (int d = 0; d < HD; ++d) out[g * HD + d] = from_f<T>(o[d]);
    }
}
#endif

// Row r attends over positions 0 .. lens[r] - 1 of sequence seqs[r], whose blocks are
// tables[seqs[r] * max_blocks ..]. q, out: [n, heads, hd]; k: [kv_heads, num_blocks, hd,
// bs]; v: [kv_heads, num_blocks, bs, hd].
template <typename T>
static void paged_attention(const T* q, const T* k, const T* v, const int64_t* tables,
                            const int64_t* seqs, const int64_t* lens, T* out, int64_t n,
                            int64_t heads, int64_t kv_heads, int64_t hd, int64_t num_blocks,
                            int64_t bs, int64_t max_blocks, int64_t max_len, float scale,
                            int threads) {
    const int64_t group = heads / kv_heads;
    const int64_t head_stride = num_blocks * bs * hd;
    auto row = &attend_row<T, 0, 0, 0>;
#if defined(__AVX512F__)
    if (bs == 16 && hd == 64 && group == 1) row = &attend_row_avx512<T, 1, 64>;
    if (bs == 16 && hd == 64 && group == 2) row = &attend_row_avx512<T, 2, 64>;
    if (bs == 16 && hd == 64 && group == 3) row = &attend_row_avx512<T, 3, 64>;
    if (bs == 16 && hd == 64 && group == 4) row = &attend_row_avx512<T, 4, 64>;
    if (bs == 16 && hd == 128 && group == 1) row = &attend_row_avx512<T, 1, 128>;
    if (bs == 16 && hd == 128 && group == 4) row = &attend_row_avx512<T, 4, 128>;
    if (bs == 16 && hd == 128 && group == 8) row = &attend_row_avx512<T, 8, 128>;
#else
    if (bs == 16 && hd == 64 && group == 3) row = &attend_row<T, 3, 64, 16>;
    if (bs == 16 && hd == 128 && group == 4) row = &attend_row<T, 4, 128, 16>;
#endif
    const int64_t padded = (max_len + bs - 1) / bs * bs;
    #pragma omp parallel num_threads(threads)
    {
        std::vector<float> scratch(group * (2 * hd + padded));  // the general version's
        #pragma omp for collapse(2) schedule(dynamic, 4)
        for (int64_t r = 0; r < n; ++r) {
            for (int64_t kh = 0; kh < kv_heads; ++kh) {
                const int64_t off = (r * heads + kh * group) * hd;
                row(q + off, k + kh * head_stride, v + kh * head_stride,
                    tables + seqs[r] * max_blocks, lens[r], scale, group, hd, bs,
                    scratch.data(), max_len, out + off);
            }
        }
    }
}

#define EXPORT(NAME, T)                                                                        \
    extern "C" void rms_norm_##NAME(const T* x, const T* w, T* out, int64_t rows, int64_t dim, \
                                    float eps, int threads) {                                  \
        rms_norm<T>(x, w, out, rows, dim, eps, threads);                                       \
    }                                                                                          \
    extern "C" void silu_mul_##NAME(const T* x, T* out, int64_t rows, int64_t inter,           \
                                    int threads) {                                             \
        silu_mul<T>(x, out, rows, inter, threads);                                             \
    }                                                                                          \
    extern "C" void rope_store_##NAME(const T* qkv, const int64_t* positions, const T* cos,    \
                                      const T* sin, const int64_t* slots, T* k, T* v,          \
                                      T* q_out, T* k_out, int64_t n, int64_t heads,            \
                                      int64_t kv_heads, int64_t hd, int64_t num_blocks,        \
                                      int64_t bs, int threads) {                               \
        rope_store<T>(qkv, positions, cos, sin, slots, k, v, q_out, k_out, n, heads, kv_heads, \
                      hd, num_blocks, bs, threads);                                            \
    }                                                                                          \
    extern "C" void paged_attention_##NAME(                                                    \
        const T* q, const T* k, const T* v, const int64_t* tables, const int64_t* seqs,        \
        const int64_t* lens, T* out, int64_t n, int64_t heads, int64_t kv_heads, int64_t hd,   \
        int64_t num_blocks, int64_t bs, int64_t max_blocks, int64_t max_len, float scale,      \
        int threads) {                                                                         \
        paged_attention<T>(q, k, v, tables, seqs, lens, out, n, heads, kv_heads, hd,           \
                           num_blocks, bs, max_blocks, max_len, scale, threads);               \
    }


// y = rnd(residual + x W^T) in bfloat16 on AMX tiles. W is in the tile layout [n / 16,
// k / 2, 16, 2]: for each block of 16 outputs, consecutive pairs of inputs, so a 1 KB
// slice of it is one B tile (16 pairs x 16 outputs) and each block streams from one
// contiguous range, prefetched ahead. oneDNN's packed matmul waited on the weights from
// memory at decode sizes (SmolLM2's 30 layers of projections, 2 threads, weights from
// memory: 8.2 against 6.1 ms at 1 row, 12.4 against 10.3 at 64) and fell behind on the
// down projection at prefill sizes (11.4 against 6.7 ms at 256 rows); it was ahead only
// on the gate/up projection at 256 rows (15.2 against 17.6). Products are exact in
// float32 and summed in float32; the residual is added before the one rounding, as
// oneDNN's binary post-op does.
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
struct TileConfig {
    uint8_t palette = 1, start_row = 0, reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
};

// Tiles 0-3: C for two row blocks x two output blocks (float32, 16 x 16); 4-5: A, the
// two row blocks' 16 x 32 inputs; 6-7: B, the two output blocks' 16 pairs x 16.
static void tile_linear(const bf16* w, const bf16* a, const bf16* residual, bf16* out,
                        int64_t rows, int64_t padded_rows, int64_t n, int64_t k, int threads) {
    const int64_t blocks = n / 16, pairs = (blocks + 1) / 2, steps = k / 32;
    #pragma omp parallel num_threads(threads)
    {
        TileConfig cfg;
        for (int t = 0; t < 8; ++t) cfg.rows[t] = 16, cfg.colsb[t] = 64;
        _tile_loadconfig(&cfg);
        alignas(64) float c[4][16][16];
        // Each thread takes one contiguous range of output blocks.
        const int64_t nt = omp_get_num_threads(), per = (pairs + nt - 1) / nt;
        const int64_t p0 = std::min(pairs, omp_get_thread_num() * per);
        const int64_t p1 = std::min(pairs, p0 + per);
        // The thread's outputs go in chunks whose weights fit in about 1 MB of L2, each
        // chunk swept once per pair of row blocks: the weights come from memory once
        // and the inputs of a row pair (32 x k) stay in L1.
        const int64_t chunk = std::max<int64_t>(1, (1 << 20) / (64 * k));
        for (int64_t c0 = p0; c0 < p1; c0 += chunk) {
            const int64_t c1 = std::min(p1, c0 + chunk);
            for (int64_t m0 = 0; m0 < padded_rows; m0 += 32) {
                const bool two_m = m0 + 16 < padded_rows;
                for (int64_t p = c0; p < c1; ++p) {
                    const int64_t nb = 2 * p;
                    const bool two_n = nb + 1 < blocks;
                    const char* b0 = reinterpret_cast<const char*>(w + nb * 16 * k);
                    const char* b1 = b0 + 32 * k;  // the next output block: k / 2 pairs x 64 B
                    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
                    for (int64_t s = 0; s < steps; ++s) {
                        if (m0 == 0) {
                            // 4 KB ahead in both weight streams, on the chunk's first sweep.
                            for (int line = 0; line < 1024; line += 64) {
                                _mm_prefetch(b0 + (s + 4) * 1024 + line, _MM_HINT_T0);
                                if (two_n) _mm_prefetch(b1 + (s + 4) * 1024 + line, _MM_HINT_T0);
                            }
                        }
                        _tile_loadd(4, a + m0 * k + s * 32, k * 2);
                        _tile_loadd(6, b0 + s * 1024, 64);
                        _tile_dpbf16ps(0, 4, 6);
                        if (two_n) {
                            _tile_loadd(7, b1 + s * 1024, 64);
                            _tile_dpbf16ps(1, 4, 7);
                        }
                        if (two_m) {
                            _tile_loadd(5, a + (m0 + 16) * k + s * 32, k * 2);
                            _tile_dpbf16ps(2, 5, 6);
                            if (two_n) _tile_dpbf16ps(3, 5, 7);
                        }
                    }
                    _tile_stored(0, c[0], 64);
                    _tile_stored(1, c[1], 64);
                    _tile_stored(2, c[2], 64);
                    _tile_stored(3, c[3], 64);
                    for (int mi = 0; mi < (two_m ? 2 : 1); ++mi) {
                        for (int ni = 0; ni < (two_n ? 2 : 1); ++ni) {
                            const int64_t col = (nb + ni) * 16;
                            for (int r = 0; r < 16 && m0 + mi * 16 + r < rows; ++r) {
                                const int64_t row = m0 + mi * 16 + r;
                                __m512 y = _mm512_load_ps(c[mi * 2 + ni][r]);
                                if (residual)
                                    y = _mm512_add_ps(y, load16(residual + row * n + col));
                                store16(out + row * n + col, y);
                            }
                        }
                    }
                }
            }
        }
        _tile_release();
    }
}
#endif

// 1 when this build has the AMX linear and the kernel let this process use AMX, else 0.
extern "C" int tile_linear_available() {
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
    // Linux hands out AMX's tile state only on request: ARCH_REQ_XCOMP_PERM for
    // XFEATURE_XTILEDATA. Once granted, it holds for every thread of the process.
    return syscall(SYS_arch_prctl, 0x1023, 18) == 0 ? 1 : 0;
#else
    return 0;
#endif
}

// x: [rows, k], out (and residual, unless null): [rows, n]; n a multiple of 16, k of 32.
extern "C" void tile_linear_bf16(const bf16* w, const bf16* x, const bf16* residual, bf16* out,
                                 int64_t rows, int64_t n, int64_t k, int threads) {
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
    const int64_t padded_rows = (rows + 15) / 16 * 16;
    if (padded_rows == rows) {
        tile_linear(w, x, residual, out, rows, rows, n, k, threads);
        return;
    }
    // A tile reads 16 rows: copy x into a zero-padded buffer kept for the next call.
    thread_local std::vector<bf16> padded;
    padded.resize(padded_rows * k);
    std::memcpy(padded.data(), x, rows * k * sizeof(bf16));
    std::memset(padded.data() + rows * k, 0, (padded_rows - rows) * k * sizeof(bf16));
    tile_linear(w, padded.data(), residual, out, rows, padded_rows, n, k, threads);
#endif
}

EXPORT(f32, float)
EXPORT(bf16, bf16)
"""

_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}
_P = ctypes.c_void_p
_I = ctypes.c_int64
_SIGNATURES: dict[str, list[type]] = {
    "rms_norm": [_P, _P, _P, _I, _I, ctypes.c_float, ctypes.c_int],
    "silu_mul": [_P, _P, _I, _I, ctypes.c_int],
    "rope_store": [_P] * 9 + [_I] * 6 + [ctypes.c_int],
    "paged_attention": [_P] * 7 + [_I] * 8 + [ctypes.c_float, ctypes.c_int],
}
# bfloat16 only, and only where the build has AMX and the process may use it.
_TILE_LINEAR_SIGNATURE: list[type] = [_P] * 4 + [_I] * 3 + [ctypes.c_int]


def supports(dtype: torch.dtype) -> bool:
    """Whether the kernels have a variant for ``dtype``."""
    return dtype in _SUFFIX


def _ptr(t: torch.Tensor) -> int:
    return t.data_ptr()


@dataclass(frozen=True)
class Kernels:
    """The loaded library. Tensor arguments are on the CPU, in one supported dtype, index
    tensors int64; inputs are made contiguous (a no-op when they are), caches and index
    tensors must already be. Shapes are the callers' contract (``paged.py``,
    ``model.py``); nothing else is checked here."""

    lib: ctypes.CDLL
    has_tile_linear: bool = False  # AMX is in this build and this process may use it

    def ops(self) -> Ops:
        """The layer's parts through these kernels: the elementwise ones always, the
        projections too where AMX is available."""
        if not self.has_tile_linear:
            return Ops(norm=self.rms_norm, silu_mul=self.silu_mul)
        return Ops(
            norm=self.rms_norm,
            silu_mul=self.silu_mul,
            linear=self.linear,
            linear_add=self.linear_add,
        )

    def linear(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        """``layer(x)`` on AMX tiles where the layer has a tile layout; through ``layer``
        itself otherwise."""
        if not layer.has_tile_layout or x.shape[0] == 0:
            return layer(x)
        return self._tile_linear(layer, x, None)

    def linear_add(self, layer: Linear, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """``layer.add(x, residual)``, on AMX tiles as ``linear``."""
        if not layer.has_tile_layout or x.shape[0] == 0:
            return layer.add(x, residual)
        return self._tile_linear(layer, x, residual.contiguous())

    def _tile_linear(
        self, layer: Linear, x: torch.Tensor, residual: torch.Tensor | None
    ) -> torch.Tensor:
        assert x.dtype == torch.bfloat16
        x = x.contiguous()
        rows = x.shape[0]
        out = x.new_empty((rows, layer.out_features))
        self.lib.tile_linear_bf16(
            _ptr(layer.tile_weight()), _ptr(x), 0 if residual is None else _ptr(residual),
            _ptr(out), rows, layer.out_features, layer.in_features, torch.get_num_threads(),
        )  # fmt: skip
        return out

    def _fn(self, name: str, dtype: torch.dtype) -> Callable[..., None]:
        fn: Callable[..., None] = getattr(self.lib, f"{name}_{_SUFFIX[dtype]}")
        return fn

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """``x``: ``[rows, dim]``, ``weight``: ``[dim]`` -> ``[rows, dim]``."""
        x = x.contiguous()
        out = torch.empty_like(x)
        rows, dim = x.shape
        self._fn("rms_norm", x.dtype)(
            _ptr(x), _ptr(weight), _ptr(out), rows, dim, eps, torch.get_num_threads()
        )
        return out

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """``gate_up``: ``[rows, 2 * inter]`` (gate, then up) -> ``silu(gate) * up``
        ``[rows, inter]``."""
        gate_up = gate_up.contiguous()
        rows, width = gate_up.shape
        out = gate_up.new_empty((rows, width // 2))
        self._fn("silu_mul", gate_up.dtype)(
            _ptr(gate_up), _ptr(out), rows, width // 2, torch.get_num_threads()
        )
        return out

    def rope_store(
        self,
        qkv: torch.Tensor,
        positions: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        slots: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        heads: int,
        return_k: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``qkv``: ``[n, (heads + 2 * kv_heads) * head_dim]``; ``positions``, ``slots``
        (``block * block_size + offset``): ``[n]``; ``cos``/``sin``: ``[max_len,
        head_dim]``; ``k_cache``: ``[kv_heads, num_blocks, head_dim, block_size]``;
        ``v_cache``: ``[kv_heads, num_blocks, block_size, head_dim]``; ``head_dim <= 512``.
        Writes K (rotated) and V at ``slots``; returns the rotated queries ``[n, heads,
        head_dim]`` and, with ``return_k``, the rotated keys ``[n, kv_heads, head_dim]``."""
        qkv = qkv.contiguous()
        n = qkv.shape[0]
        kv_heads, num_blocks, hd, bs = k_cache.shape
        q = qkv.new_empty((n, heads, hd))
        k = qkv.new_empty((n, kv_heads, hd)) if return_k else None
        self._fn("rope_store", qkv.dtype)(
            _ptr(qkv), _ptr(positions), _ptr(cos), _ptr(sin), _ptr(slots), _ptr(k_cache),
            _ptr(v_cache), _ptr(q), 0 if k is None else _ptr(k), n, heads, kv_heads, hd,
            num_blocks, bs, torch.get_num_threads(),
        )  # fmt: skip
        return q, k

    def paged_attention(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        tables: torch.Tensor,
        seqs: torch.Tensor,
        lens: torch.Tensor,
        max_len: int,
        scale: float,
    ) -> torch.Tensor:
        """``q``: ``[n, heads, head_dim]``; caches as in ``rope_store``; ``tables``:
        ``[num_seqs, max_blocks]`` block ids; ``seqs``: ``[n]`` the row of ``tables`` of
        each query; ``lens``: ``[n]`` keys each query sees (positions ``0 .. lens - 1``),
        each in ``1 .. max_len``. Returns ``[n, heads, head_dim]``."""
        q = q.contiguous()
        n, heads, hd = q.shape
        kv_heads, num_blocks, _, bs = k_cache.shape
        out = torch.empty_like(q)
        self._fn("paged_attention", q.dtype)(
            _ptr(q), _ptr(k_cache), _ptr(v_cache), _ptr(tables), _ptr(seqs), _ptr(lens),
            _ptr(out), n, heads, kv_heads, hd, num_blocks, bs, tables.shape[1], max_len,
            scale, torch.get_num_threads(),
        )  # fmt: skip
        return out


log = logging.getLogger(__name__)
_lock = threading.Lock()
_loaded: dict[Path, Kernels | None] = {}


def _cpu_key() -> str:
    """What ``-march=native`` depends on: the CPU model and its feature flags."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    lines = [ln for ln in info.splitlines() if ln.startswith(("model name", "flags"))]
    return "\n".join(sorted(set(lines)))


def library_path(cache_dir: Path) -> Path:
    """Where the build for this source, these flags and this CPU is cached."""
    key = "\n".join([str(ABI_VERSION), SOURCE, " ".join(COMPILE_FLAGS), _cpu_key()])
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return cache_dir / "torch_executor" / "kernels" / f"cpu_kernels-{digest}.so"


def _compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")


def _build(target: Path) -> None:
    """Compile into a temporary file beside ``target`` and rename it into place, so a
    concurrent start never loads a half-written library."""
    compiler = _compiler()
    if compiler is None:
        raise OSError("no C++ compiler found (set CXX)")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".build-") as tmp:
        src = Path(tmp) / "cpu_kernels.cpp"
        src.write_text(SOURCE)
        out = Path(tmp) / target.name
        subprocess.run(
            [compiler, *COMPILE_FLAGS, str(src), "-o", str(out)],
            check=True,
            capture_output=True,
            timeout=300,
        )
        os.replace(out, target)


def load_kernels(cache_dir: Path) -> Kernels | None:
    """The CPU kernels, built on first use; ``None`` when they cannot be built or loaded
    here (no compiler, a failed build), in which case callers use torch ops. Loaded once
    per process and cache folder."""
    with _lock:
        if cache_dir in _loaded:
            return _loaded[cache_dir]
        kernels: Kernels | None = None
        path = library_path(cache_dir)
        try:
            if not path.exists():
                _build(path)
            lib = ctypes.CDLL(str(path))
            for name, argtypes in _SIGNATURES.items():
                for suffix in _SUFFIX.values():
                    fn = getattr(lib, f"{name}_{suffix}")
                    fn.argtypes, fn.restype = argtypes, None
            tile = lib.tile_linear_bf16
            tile.argtypes, tile.restype = _TILE_LINEAR_SIGNATURE, None
            lib.tile_linear_available.argtypes = []
            lib.tile_linear_available.restype = ctypes.c_int
            kernels = Kernels(lib, has_tile_linear=bool(lib.tile_linear_available()))
        except (OSError, subprocess.SubprocessError, AttributeError) as err:
            detail = getattr(err, "stderr", b"") or b""
            log.warning(
                "CPU kernels unavailable (%s%s); the torch executor uses torch ops",
                err,
                f": {detail.decode(errors='replace')[-500:]}" if detail else "",
            )
            kernels = None
        _loaded[cache_dir] = kernels
        return kernels
