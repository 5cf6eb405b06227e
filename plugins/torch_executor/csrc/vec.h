// A float vector of W lanes, so each kernel is written once for every ISA level:
//   AVX-512 (x86-64-v4 and up): W = 16, one __m512;
//   AVX2 (x86-64-v3):           W = 8,  one __m256;
//   portable (anything else):   W = 8,  a plain array the compiler vectorises as it can.
// Loads widen bfloat16, float16 and int8; stores to either round to nearest even. Inputs are
// finite (no NaN handling). Every function is inline and free of state.
// At the end, integer dot products over a block of 16 outputs (q_*), per level as well.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

typedef uint16_t bf16;

// ---------------------------------------------------------------- scalars
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

// IEEE binary16 (torch.float16): a KV cache type for the float32 model. A struct, so
// overloads tell its bits from bfloat16's. Conversions as torch's casts: exact to float,
// round to nearest even from it, past 65504 to infinity. F16C (every level but the
// portable one) converts in hardware; the portable level in software.
struct f16 { uint16_t bits; };
#if defined(__F16C__)
static inline float to_f(f16 x) { return _cvtsh_ss(x.bits); }
template <> inline f16 from_f<f16>(float x) {
    return {(uint16_t)_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)};
}
#else
static inline float to_f(f16 x) {
    const uint32_t sign = (uint32_t)(x.bits & 0x8000u) << 16;
    const uint32_t exp = (x.bits >> 10) & 0x1Fu, man = x.bits & 0x3FFu;
    if (exp == 0) {  // zero or subnormal: man * 2^-24, exact in float
        const float f = (float)man * 5.9604644775390625e-8f;
        return sign ? -f : f;
    }
    const uint32_t bits = exp == 31 ? 0x7F800000u | (man << 13) : ((exp + 112) << 23) | (man << 13);
    return __builtin_bit_cast(float, sign | bits);
}
template <> inline f16 from_f<f16>(float x) {
    uint32_t u = __builtin_bit_cast(uint32_t, x);
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    u &= 0x7FFFFFFFu;
    if (u >= 0x477FF000u) return {(uint16_t)(sign | 0x7C00u)};  // rounds past 65504: inf
    if (u < 0x38800000u) {  // below 2^-14: a subnormal half, |x| * 2^24 rounded (exact product)
        const float scaled = __builtin_bit_cast(float, u) * 16777216.0f;
        return {(uint16_t)(sign | (uint16_t)std::nearbyint(scaled))};
    }
    // Rebias the exponent (127 -> 15) and round the low 13 mantissa bits to nearest even;
    // a carry out of the mantissa moves into the exponent, as it should.
    u += 0xC8000FFFu + ((u >> 13) & 1u);
    return {(uint16_t)(sign | (u >> 13))};
}
#endif

// exp for softmax: Cephes' single-precision polynomial after range reduction (about 1
// ulp), branch-free; exactly 0 below -87 (masked keys).
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

// Cephes' coefficients, shared by every vector exp below.
#define EXP_POLY(FMA, SET1, y, r)                  \
    y = SET1(1.9875691500e-4f);                    \
    y = FMA(y, r, SET1(1.3981999507e-3f));         \
    y = FMA(y, r, SET1(8.3334519073e-3f));         \
    y = FMA(y, r, SET1(4.1665795894e-2f));         \
    y = FMA(y, r, SET1(1.6666665459e-1f));         \
    y = FMA(y, r, SET1(5.0000001201e-1f))

#if defined(__AVX512F__)
// ---------------------------------------------------------------- AVX-512
#define VEC_ISA "avx512"
constexpr int W = 16;
struct vf { __m512 v; };
static inline vf vzero() { return {_mm512_setzero_ps()}; }
static inline vf vset1(float x) { return {_mm512_set1_ps(x)}; }
static inline vf vload(const float* p) { return {_mm512_loadu_ps(p)}; }
static inline vf vload(const bf16* p) {
    __m512i u = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return {_mm512_castsi512_ps(_mm512_slli_epi32(u, 16))};
}
static inline vf vload(const int8_t* p) {
    return {_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))))};
}
static inline void vstore(float* p, vf a) { _mm512_storeu_ps(p, a.v); }
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
static inline void vstore(bf16* p, vf a) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), to_bf16(a.v));
}
static inline vf vload(const f16* p) {
    return {_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))};
}
static inline void vstore(f16* p, vf a) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtps_ph(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
static inline vf operator+(vf a, vf b) { return {_mm512_add_ps(a.v, b.v)}; }
static inline vf operator-(vf a, vf b) { return {_mm512_sub_ps(a.v, b.v)}; }
static inline vf operator*(vf a, vf b) { return {_mm512_mul_ps(a.v, b.v)}; }
static inline vf vfma(vf a, vf b, vf c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
static inline vf vmax(vf a, vf b) { return {_mm512_max_ps(a.v, b.v)}; }
static inline float vsum(vf a) { return _mm512_reduce_add_ps(a.v); }
static inline float vhmax(vf a) { return _mm512_reduce_max_ps(a.v); }
// Lanes from n on replaced by fill.
static inline vf vfirst(vf a, int n, float fill) {
    const __mmask16 keep = n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << std::max(n, 0)) - 1u);
    return {_mm512_mask_mov_ps(_mm512_set1_ps(fill), keep, a.v)};
}
// 1 / a by a reciprocal estimate and one Newton step (~1 ulp): a divide was a loop's
// bottleneck.
static inline vf vrecip(vf a) {
    __m512 rc = _mm512_rcp14_ps(a.v);
    return {_mm512_mul_ps(rc, _mm512_fnmadd_ps(a.v, rc, _mm512_set1_ps(2.0f)))};
}
static inline vf vexp(vf a) {
    const __m512 x = a.v;
    const __m512 xc = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
    const __m512 n = _mm512_roundscale_ps(
        _mm512_fmadd_ps(xc, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)),
        _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), xc);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
    __m512 y;
    EXP_POLY(_mm512_fmadd_ps, _mm512_set1_ps, y, r);
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    const __m512 result = _mm512_scalef_ps(y, n);  // y * 2^n, exact: n is in [-126, 127]
    return {_mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_GE_OQ), result)};
}
// Round through T: identity for float, one bfloat16 rounding (to nearest even) otherwise.
template <typename T> static inline vf vround(vf a) {
    if constexpr (std::is_same_v<T, float>) {
        return a;
    } else {
        return {_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(to_bf16(a.v)), 16))};
    }
}
static inline void vprefetch(const void* p) { _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0); }

#elif defined(__AVX2__) && defined(__FMA__)
// ---------------------------------------------------------------- AVX2 + FMA
#define VEC_ISA "avx2"
constexpr int W = 8;
struct vf { __m256 v; };
static inline vf vzero() { return {_mm256_setzero_ps()}; }
static inline vf vset1(float x) { return {_mm256_set1_ps(x)}; }
static inline vf vload(const float* p) { return {_mm256_loadu_ps(p)}; }
static inline vf vload(const bf16* p) {
    __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return {_mm256_castsi256_ps(_mm256_slli_epi32(u, 16))};
}
static inline vf vload(const int8_t* p) {
    return {_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))))};
}
static inline void vstore(float* p, vf a) { _mm256_storeu_ps(p, a.v); }
static inline __m128i to_bf16(__m256 v) {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), 16);
    // Pack the 32-bit halves (each <= 0xFFFF, so no saturation) within lanes, then gather
    // the two lanes' low quarters.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    return _mm256_castsi256_si128(packed);
}
static inline void vstore(bf16* p, vf a) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), to_bf16(a.v));
}
static inline vf vload(const f16* p) {
    return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))};
}
static inline void vstore(f16* p, vf a) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm256_cvtps_ph(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
static inline vf operator+(vf a, vf b) { return {_mm256_add_ps(a.v, b.v)}; }
static inline vf operator-(vf a, vf b) { return {_mm256_sub_ps(a.v, b.v)}; }
static inline vf operator*(vf a, vf b) { return {_mm256_mul_ps(a.v, b.v)}; }
static inline vf vfma(vf a, vf b, vf c) { return {_mm256_fmadd_ps(a.v, b.v, c.v)}; }
static inline vf vmax(vf a, vf b) { return {_mm256_max_ps(a.v, b.v)}; }
static inline float vsum(vf a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a.v), _mm256_extractf128_ps(a.v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
static inline float vhmax(vf a) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(a.v), _mm256_extractf128_ps(a.v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
static inline vf vfirst(vf a, int n, float fill) {
    const __m256 lane = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256 keep = _mm256_cmp_ps(lane, _mm256_set1_ps((float)n), _CMP_LT_OQ);
    return {_mm256_blendv_ps(_mm256_set1_ps(fill), a.v, keep)};
}
static inline vf vrecip(vf a) {
    __m256 rc = _mm256_rcp_ps(a.v);
    return {_mm256_mul_ps(rc, _mm256_fnmadd_ps(a.v, rc, _mm256_set1_ps(2.0f)))};
}
static inline vf vexp(vf a) {
    const __m256 x = a.v;
    const __m256 xc = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    const __m256 n = _mm256_floor_ps(
        _mm256_fmadd_ps(xc, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(2.12194440e-4f), r);
    __m256 y;
    EXP_POLY(_mm256_fmadd_ps, _mm256_set1_ps, y, r);
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    // 2^n from its exponent bits: n is in [-125, 127] after the clamp.
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    const __m256 result = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
    return {_mm256_and_ps(result, _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_GE_OQ))};
}
template <typename T> static inline vf vround(vf a) {
    if constexpr (std::is_same_v<T, float>) {
        return a;
    } else {
        return {_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(to_bf16(a.v)), 16))};
    }
}
static inline void vprefetch(const void* p) { _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0); }

#else
// ---------------------------------------------------------------- portable
#define VEC_ISA "portable"
constexpr int W = 8;
struct vf { float v[W]; };
#define VEC_MAP(expr)                   \
    vf out;                             \
    for (int i = 0; i < W; ++i) out.v[i] = (expr); \
    return out
static inline vf vzero() { VEC_MAP(0.0f); }
static inline vf vset1(float x) { VEC_MAP(x); }
static inline vf vload(const float* p) { VEC_MAP(p[i]); }
static inline vf vload(const bf16* p) { VEC_MAP(to_f(p[i])); }
static inline vf vload(const int8_t* p) { VEC_MAP((float)p[i]); }
static inline void vstore(float* p, vf a) { for (int i = 0; i < W; ++i) p[i] = a.v[i]; }
static inline void vstore(bf16* p, vf a) { for (int i = 0; i < W; ++i) p[i] = from_f<bf16>(a.v[i]); }
static inline vf vload(const f16* p) { VEC_MAP(to_f(p[i])); }
static inline void vstore(f16* p, vf a) { for (int i = 0; i < W; ++i) p[i] = from_f<f16>(a.v[i]); }
static inline vf operator+(vf a, vf b) { VEC_MAP(a.v[i] + b.v[i]); }
static inline vf operator-(vf a, vf b) { VEC_MAP(a.v[i] - b.v[i]); }
static inline vf operator*(vf a, vf b) { VEC_MAP(a.v[i] * b.v[i]); }
// a * b + c, left to the compiler: std::fma is a slow library call without hardware FMA.
static inline vf vfma(vf a, vf b, vf c) { VEC_MAP(a.v[i] * b.v[i] + c.v[i]); }
static inline vf vmax(vf a, vf b) { VEC_MAP(std::max(a.v[i], b.v[i])); }
static inline float vsum(vf a) { float s = 0.f; for (int i = 0; i < W; ++i) s += a.v[i]; return s; }
static inline float vhmax(vf a) { float m = a.v[0]; for (int i = 1; i < W; ++i) m = std::max(m, a.v[i]); return m; }
static inline vf vfirst(vf a, int n, float fill) { VEC_MAP(i < n ? a.v[i] : fill); }
static inline vf vrecip(vf a) { VEC_MAP(1.0f / a.v[i]); }
static inline vf vexp(vf a) { VEC_MAP(fast_exp(a.v[i])); }
template <typename T> static inline vf vround(vf a) { VEC_MAP(rnd<T>(a.v[i])); }
static inline void vprefetch(const void* p) { __builtin_prefetch(p, 0, 3); }
#undef VEC_MAP
#endif

// ---------------------------------------------------------------- integer dot products
// int8 weights times int16 activations, summed exactly in int32. Activations are
// quantised per group of 64 (symmetric, |q| <= 32767); one step covers a block of 16
// outputs and 4 inputs for R rows, weights as 64 bytes [16 outputs][4 inputs] (signed,
// |w| <= 127):
//   float qx_quantize(const float* x, int16_t* q)
//       the group's 64 values -> q = x * (32767 / max|x|) rounded half away from zero
//       (0 for an all-zero group); returns the scale max|x| / 32767;
//   q_zero(qacc& acc)
//   q_dot<R>(qacc* acc, const int8_t* w, const int16_t* x, int64_t stride)
//       acc[r][o] += sum_j w[o][j] * x[r * stride + j], j < 4, r < R <= Q_ROWS;
//   q_fma(float* total, const qacc& acc, const float* ws, float xs)
//       total[o] += float(acc[o]) * ws[o] * xs; total, ws: 16 floats.
// Why int16 activations: int8 ones (llama.cpp's Q8_0 x Q8_0) moved SmolLM2's logits by
// 0.20 on average (1.86 at most) and its greedy tokens off float32's at 4.3% of
// positions, outside the accuracy bar; int16 keeps the activations within 1/65534 of
// their group's largest. Products are formed by madd_epi16 (pairs of int16, summed into
// int32): on Zen 1 it ran as fast as the byte dot product (maddubs with the sign trick),
// both being bound by the same vector multiplier. A group's sum is below 64 * 127 *
// 32767 < 2^31, so it never overflows.
constexpr int Q_GROUP = 64;

// The scalar rounding every level matches: v + 0.5 (or - 0.5) in float, then truncated.
static inline int16_t q_round(float v) {
    v = std::min(std::max(v, -32767.0f), 32767.0f);
    return (int16_t)(int32_t)(v + (v >= 0.f ? 0.5f : -0.5f));
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
constexpr int Q_ROWS = 4;
struct qacc { __m512i v[2]; };  // outputs 0-7 and 8-15, [output][2 partial sums]
static inline float qx_quantize(const float* x, int16_t* q) {
    const __m512 sign = _mm512_set1_ps(-0.0f);
    __m512 amax = _mm512_setzero_ps();
    for (int i = 0; i < Q_GROUP; i += 16) amax = _mm512_max_ps(amax, _mm512_abs_ps(_mm512_loadu_ps(x + i)));
    const float m = _mm512_reduce_max_ps(amax);
    const __m512 inv = _mm512_set1_ps(m > 0.f ? 32767.0f / m : 0.f);
    for (int i = 0; i < Q_GROUP; i += 16) {
        const __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x + i), inv);
        const __m512 half = _mm512_or_ps(_mm512_and_ps(v, sign), _mm512_set1_ps(0.5f));
        const __m512i t = _mm512_cvttps_epi32(_mm512_add_ps(v, half));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + i), _mm512_cvtsepi32_epi16(t));
    }
    return m / 32767.0f;
}
static inline void q_zero(qacc& acc) { acc.v[0] = acc.v[1] = _mm512_setzero_si512(); }
template <int R>
static inline void q_dot(qacc* acc, const int8_t* wp, const int16_t* xp, int64_t stride) {
    __m512i x[R];
    for (int r = 0; r < R; ++r) {
        int64_t x4;
        std::memcpy(&x4, xp + r * stride, 8);
        x[r] = _mm512_set1_epi64(x4);
    }
    for (int u = 0; u < 2; ++u) {
        const __m512i w = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp + 32 * u)));
        for (int r = 0; r < R; ++r) {
#if defined(__AVX512VNNI__)
            acc[r].v[u] = _mm512_dpwssd_epi32(acc[r].v[u], x[r], w);
#else
            acc[r].v[u] = _mm512_add_epi32(acc[r].v[u], _mm512_madd_epi16(x[r], w));
#endif
        }
    }
}
static inline void q_fma(float* total, const qacc& acc, const float* ws, float xs) {
    // Even and odd lanes of (outputs 0-7, outputs 8-15): each output's two partial sums.
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    const __m512i sums = _mm512_add_epi32(_mm512_permutex2var_epi32(acc.v[0], even, acc.v[1]),
                                          _mm512_permutex2var_epi32(acc.v[0], odd, acc.v[1]));
    const __m512 s = _mm512_mul_ps(_mm512_loadu_ps(ws), _mm512_set1_ps(xs));
    _mm512_storeu_ps(total, _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), s, _mm512_loadu_ps(total)));
}

#elif defined(__AVX2__) && defined(__FMA__)
// Two rows a step: four int32 vectors a row, more would spill to the stack.
constexpr int Q_ROWS = 2;
struct qacc { __m256i v[4]; };  // v[u]: outputs 4u .. 4u + 3, [output][2 partial sums]
static inline float qx_quantize(const float* x, int16_t* q) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 amax = _mm256_setzero_ps();
    for (int i = 0; i < Q_GROUP; i += 8) amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)));
    const float m = vhmax({amax});
    const __m256 inv = _mm256_set1_ps(m > 0.f ? 32767.0f / m : 0.f);
    for (int i = 0; i < Q_GROUP; i += 16) {
        __m256i t[2];
        for (int j = 0; j < 2; ++j) {
            const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i + 8 * j), inv);
            const __m256 half = _mm256_or_ps(_mm256_and_ps(v, sign), _mm256_set1_ps(0.5f));
            t[j] = _mm256_cvttps_epi32(_mm256_add_ps(v, half));
        }
        // packs works within 128-bit lanes (quadwords 0 2 1 3 of the order wanted).
        const __m256i h = _mm256_permute4x64_epi64(_mm256_packs_epi32(t[0], t[1]), 0xD8);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + i), h);
    }
    return m / 32767.0f;
}
static inline void q_zero(qacc& acc) {
    for (int u = 0; u < 4; ++u) acc.v[u] = _mm256_setzero_si256();
}
template <int R>
static inline void q_dot(qacc* acc, const int8_t* wp, const int16_t* xp, int64_t stride) {
    __m256i x[R];
    for (int r = 0; r < R; ++r) {
        int64_t x4;
        std::memcpy(&x4, xp + r * stride, 8);
        x[r] = _mm256_set1_epi64x(x4);
    }
    for (int u = 0; u < 4; ++u) {
        const __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wp + 16 * u)));
        for (int r = 0; r < R; ++r) acc[r].v[u] = _mm256_add_epi32(acc[r].v[u], _mm256_madd_epi16(x[r], w));
    }
}
static inline void q_fma(float* total, const qacc& acc, const float* ws, float xs) {
    const __m256 x = _mm256_set1_ps(xs);
    for (int u = 0; u < 2; ++u) {
        // Within lanes, hadd gives outputs (0 1 4 5 | 2 3 6 7) of the 8; restore order.
        const __m256i sums = _mm256_permute4x64_epi64(
            _mm256_hadd_epi32(acc.v[2 * u], acc.v[2 * u + 1]), 0xD8);
        const __m256 s = _mm256_mul_ps(_mm256_loadu_ps(ws + 8 * u), x);
        const __m256 t = _mm256_loadu_ps(total + 8 * u);
        _mm256_storeu_ps(total + 8 * u, _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), s, t));
    }
}

#else
constexpr int Q_ROWS = 4;
struct qacc { int32_t v[16]; };
static inline float qx_quantize(const float* x, int16_t* q) {
    float m = 0.f;
    for (int i = 0; i < Q_GROUP; ++i) m = std::max(m, std::fabs(x[i]));
    const float inv = m > 0.f ? 32767.0f / m : 0.f;
    for (int i = 0; i < Q_GROUP; ++i) q[i] = q_round(x[i] * inv);
    return m / 32767.0f;
}
static inline void q_zero(qacc& acc) {
    for (int o = 0; o < 16; ++o) acc.v[o] = 0;
}
template <int R>
static inline void q_dot(qacc* acc, const int8_t* w, const int16_t* x, int64_t stride) {
    for (int r = 0; r < R; ++r) {
        for (int o = 0; o < 16; ++o) {
            int32_t s = 0;
            for (int j = 0; j < 4; ++j) s += (int32_t)w[o * 4 + j] * (int32_t)x[r * stride + j];
            acc[r].v[o] += s;
        }
    }
}
static inline void q_fma(float* total, const qacc& acc, const float* ws, float xs) {
    for (int o = 0; o < 16; ++o) total[o] += (float)acc.v[o] * (ws[o] * xs);
}
#endif
