// The bodies of the CPU kernels: RMSNorm, SiLU-times-up, RoPE with the K/V cache write,
// paged attention for rows that attend through a block table in place, and projections
// over compact weights (int8 with per-group scales, or bfloat16) for the float32 model.
// Written once over vec.h; built once per ISA level (kernel_build.py). kernels.cpp
// exports each op on its own, stack.cpp every layer of a decode step in one call.
//
// Numerics: float32 accumulation everywhere (the int8 projections: exact int32 sums per
// group of 64 inputs, scaled and summed in float32); in bfloat16, RMSNorm, RoPE and SiLU round
// where transformers' bfloat16 graph rounds; attention keeps its scores and
// probabilities in float32.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "vec.h"

// Each op's body shares its loop among the threads of the enclosing parallel region
// (an orphaned `omp for`, which ends in a barrier) and runs on the calling thread alone
// outside one: the single-op exports open a region per call, the decode stack
// (stack.cpp) one region for every layer of a step.

// out[r] = rnd(w * rnd(x[r] / rms(x[r]))), as transformers' LlamaRMSNorm; with an output
// type O other than T (float32 in, bfloat16 out, for bfloat16 matmuls of the float32
// model), the product is rounded once, to O, as it is stored.
template <typename T, typename O = T>
static void rms_norm_rows(const T* x, const T* w, O* out, int64_t rows, int64_t dim, float eps) {
    #pragma omp for
    for (int64_t r = 0; r < rows; ++r) {
        const T* xr = x + r * dim;
        O* o = out + r * dim;
        int64_t d0 = 0;
        vf acc = vzero();
        for (; d0 + W <= dim; d0 += W) {
            const vf v = vload(xr + d0);
            acc = vfma(v, v, acc);
        }
        float ss = vsum(acc);
        for (int64_t d = d0; d < dim; ++d) { float v = to_f(xr[d]); ss += v * v; }
        const float inv = 1.0f / std::sqrt(ss / (float)dim + eps);
        int64_t d = 0;
        const vf iv = vset1(inv);
        for (; d + W <= dim; d += W) vstore(o + d, vload(w + d) * vround<T>(vload(xr + d) * iv));
        for (; d < dim; ++d) o[d] = from_f<O>(to_f(w[d]) * rnd<T>(to_f(xr[d]) * inv));
    }
}

// x: [rows, 2 inter] (gate, then up) -> out [rows, inter] = rnd(rnd(silu(gate)) * up), as
// transformers' LlamaMLP rounds in bfloat16.
template <typename T>
static void silu_mul_rows(const T* x, T* out, int64_t rows, int64_t inter) {
    #pragma omp for
    for (int64_t r = 0; r < rows; ++r) {
        const T* gate = x + r * 2 * inter;
        const T* up = gate + inter;
        T* o = out + r * inter;
        int64_t i = 0;
        for (; i + W <= inter; i += W) {
            const vf g = vload(gate + i);
            const vf act = vround<T>(g * vrecip(vset1(1.0f) + vexp(vzero() - g)));
            vstore(o + i, act * vload(up + i));
        }
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
    for (; d + W <= half; d += W) {
        const vf x1 = vload(x + d), x2 = vload(x + half + d);
        const vf neg = vzero() - x2;
        vstore(out + d, vround<T>(x1 * vload(c + d)) + vround<T>(neg * vload(s + d)));
        vstore(out + half + d,
               vround<T>(x2 * vload(c + half + d)) + vround<T>(x1 * vload(s + half + d)));
    }
    for (; d < half; ++d) {
        out[d] = from_f<T>(rnd<T>(to_f(x[d]) * to_f(c[d])) + rnd<T>(-to_f(x[d + half]) * to_f(s[d])));
        out[half + d] = from_f<T>(rnd<T>(to_f(x[half + d]) * to_f(c[half + d])) +
                                  rnd<T>(to_f(x[d]) * to_f(s[half + d])));
    }
}

// qkv: [n, (heads + 2 kv_heads) hd] -> q_out [n, heads, hd] with RoPE; K (RoPE) written
// into k [kv_heads, num_blocks, hd, bs] and V into v [kv_heads, num_blocks, bs, hd] at
// slots[r] (block slots[r] / bs, offset slots[r] % bs); also the rotated K into k_out
// [n, kv_heads, hd] unless it is null. hd <= 512. The cache's type C may be narrower
// than T (a bfloat16 cache for the float32 model): K and V are rounded to C as they
// are stored, and k_out holds K as the cache does.
template <typename T, typename C = T>
static void rope_store_rows(const T* qkv, const int64_t* positions, const T* cos, const T* sin,
                            const int64_t* slots, C* k, C* v, T* q_out, T* k_out, int64_t n,
                            int64_t heads, int64_t kv_heads, int64_t hd, int64_t num_blocks,
                            int64_t bs) {
    const int64_t stride = (heads + 2 * kv_heads) * hd;
    const int64_t head_stride = num_blocks * bs * hd;
    #pragma omp for
    for (int64_t r = 0; r < n; ++r) {
        if (r + 1 < n) {
            // The next row's slots, for writing: its K column touches a line every
            // 64 bytes / (bs elements) of head dims, each a miss to memory (the block was
            // last written a step ago), so the misses overlap this row's RoPE.
            const int64_t nb = slots[r + 1] / bs, no = slots[r + 1] % bs;
            const int64_t every = std::max<int64_t>(1, 64 / (bs * (int64_t)sizeof(C)));
            for (int64_t h = 0; h < kv_heads; ++h) {
                const C* kt = k + h * head_stride + nb * hd * bs + no;
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
            C* kt = k + h * head_stride + block * hd * bs + offset;
            C* vt = v + h * head_stride + (block * bs + offset) * hd;
            const T* vr = row + (heads + kv_heads + h) * hd;
            if constexpr (std::is_same_v<T, C>) {
                for (int64_t d = 0; d < hd; ++d) kt[d * bs] = kr[d];
                std::memcpy(vt, vr, hd * sizeof(T));
            } else {
                for (int64_t d = 0; d < hd; ++d) {
                    kt[d * bs] = from_f<C>(to_f(kr[d]));
                    kr[d] = from_f<T>(to_f(kt[d * bs]));
                    vt[d] = from_f<C>(to_f(vr[d]));
                }
            }
        }
    }
}

// One row of q against one KV head, any shape: the `group` query heads that share the
// head are done together, so each K/V row is read once; K blocks are stored transposed
// ([hd, bs]), so a block's scores accumulate lane-wise. Two passes (scores, then
// softmax, then V) over a scratch buffer.
template <typename T, typename C = T>
static void attend_row(const T* q, const C* kbase, const C* vbase, const int64_t* table,
                       int64_t len, float scale, int64_t G, int64_t HD, int64_t BS,
                       float* scratch, int64_t max_len, T* out) {
    const int64_t padded = (max_len + BS - 1) / BS * BS;
    float* qf = scratch;                 // [G, HD]
    float* acc = qf + G * HD;            // [G, HD]
    float* scores = acc + G * HD;        // [G, padded]
    for (int64_t j = 0; j < G * HD; ++j) qf[j] = to_f(q[j]) * scale;
    // Whole blocks: slots past len hold finite numbers (the pool is zero-filled); their
    // scores are overwritten with -inf-like values so softmax gives them exactly 0.
    const int64_t padded_len = (len + BS - 1) / BS * BS;
    for (int64_t t0 = 0; t0 < len; t0 += BS) {
        const C* kt = kbase + table[t0 / BS] * HD * BS;
        for (int64_t g = 0; g < G; ++g) {
            float* s = scores + g * padded + t0;
            for (int64_t i = 0; i < BS; ++i) s[i] = 0.f;
            for (int64_t d = 0; d < HD; ++d) {
                const float qd = qf[g * HD + d];
                for (int64_t i = 0; i < BS; ++i) s[i] += qd * to_f(kt[d * BS + i]);
            }
        }
    }
    for (int64_t g = 0; g < G; ++g) {
        float* sg = scores + g * padded;
        for (int64_t t = len; t < padded_len; ++t) sg[t] = -1e30f;
        float mx = sg[0];
        for (int64_t t = 0; t < padded_len; ++t) mx = std::max(mx, sg[t]);
        float sum = 0.f;
        for (int64_t t = 0; t < padded_len; ++t) {
            const float e = fast_exp(sg[t] - mx);
            sg[t] = e;
            sum += e;
        }
        const float inv = 1.0f / sum;
        for (int64_t t = 0; t < padded_len; ++t) sg[t] *= inv;
    }
    for (int64_t j = 0; j < G * HD; ++j) acc[j] = 0.f;
    for (int64_t t0 = 0; t0 < len; t0 += BS) {
        const C* vb = vbase + table[t0 / BS] * BS * HD;
        const int64_t m = std::min(BS, len - t0);
        for (int64_t i = 0; i < m; ++i) {
            const C* v = vb + i * HD;
            for (int64_t g = 0; g < G; ++g) {
                const float p = scores[g * padded + t0 + i];
                for (int64_t d = 0; d < HD; ++d) acc[g * HD + d] += p * to_f(v[d]);
            }
        }
    }
    for (int64_t j = 0; j < G * HD; ++j) out[j] = from_f<T>(acc[j]);
}

// The same computation for 16-token blocks with G and HD fixed at compile time, over the
// keys at positions begin .. end - 1 (begin a multiple of 16): a block's 16 scores of one
// query head are 16 / W vectors, so K^T rows need no horizontal sums, and softmax runs
// online (running max and sum per head), so K and V of a block are read once, in one
// pass. Leaves the unnormalised part: acc [G, HD] (the probability-weighted sum of V
// under max m), m [G] and the sum of probabilities l [G]; merge_parts combines parts.
template <typename T, typename C, int G, int HD>
static void attend_part(const T* q, const C* kbase, const C* vbase, const int64_t* table,
                        int64_t begin, int64_t end, float scale, float* acc_out, float* m_out,
                        float* l_out) {
    constexpr int BS = 16, V = HD / W, SV = BS / W;
    static_assert(G <= W, "one vector holds every head's rescale factor");
    vf acc[G][V];
    float m[G], l[G];
    alignas(64) float qs[G][HD];
    for (int g = 0; g < G; ++g) {
        for (int j = 0; j < V; ++j) {
            vstore(qs[g] + j * W, vload(q + g * HD + j * W) * vset1(scale));
            acc[g][j] = vzero();
        }
        m[g] = -INFINITY;
        l[g] = 0.f;
    }
    alignas(64) float p[G][BS];
    for (int64_t t0 = begin; t0 < end; t0 += BS) {
        const int64_t block = table[t0 / BS];
        const C* kt = kbase + block * HD * BS;
        const C* vb = vbase + block * BS * HD;
        const int valid = (int)std::min<int64_t>(BS, end - t0);
        // Blocks are scattered, so the hardware prefetcher cannot see the next one: its
        // lines are prefetched a few per step of the QK loop below (the last block
        // prefetches itself, which costs nothing). Issued all at once, the prefetches
        // stalled on the core's fill buffers with no work left to overlap them.
        const int64_t next = t0 + BS < end ? table[t0 / BS + 1] : block;
        const char* nk = reinterpret_cast<const char*>(kbase + next * HD * BS);
        const char* nv = reinterpret_cast<const char*>(vbase + next * BS * HD);
        // P partial sums per head over interleaved d: one sum would be a chain of HD
        // dependent FMAs, whose latency (not the FMA rate) then set a block's time.
        constexpr int P = G == 1 ? 4 : 2;
        constexpr int LINES = HD * BS * (int)sizeof(C) / 64;  // per K (and per V) block
        constexpr int PER_STEP = (LINES + HD / P - 1) / (HD / P);
        int line = 0;
        vf s[G][SV], part[G][P][SV];
        for (int g = 0; g < G; ++g)
            for (int j = 0; j < P; ++j)
                for (int u = 0; u < SV; ++u) part[g][j][u] = vzero();
        for (int d = 0; d < HD; d += P) {
            for (int i = 0; i < PER_STEP && line < LINES; ++i, ++line) {
                vprefetch(nk + line * 64);
                vprefetch(nv + line * 64);
            }
            for (int j = 0; j < P; ++j) {
                for (int u = 0; u < SV; ++u) {
                    const vf kd = vload(kt + (d + j) * BS + u * W);
                    for (int g = 0; g < G; ++g)
                        part[g][j][u] = vfma(vset1(qs[g][d + j]), kd, part[g][j][u]);
                }
            }
        }
        // Rescale factors exp(old max - new max) of all heads in one vector exp.
        alignas(64) float shift[W] = {}, alpha[W];
        float m_new[G];
        for (int g = 0; g < G; ++g) {
            float mx = m[g];
            for (int u = 0; u < SV; ++u) {
                s[g][u] = part[g][0][u];
                for (int j = 1; j < P; ++j) s[g][u] = s[g][u] + part[g][j][u];
                s[g][u] = vfirst(s[g][u], valid - u * W, -INFINITY);
                mx = std::max(mx, vhmax(s[g][u]));
            }
            m_new[g] = mx;
            shift[g] = m[g] - m_new[g];  // -inf on the first block: alpha 0
        }
        vstore(alpha, vexp(vload(shift)));
        for (int g = 0; g < G; ++g) {
            float total = 0.f;
            for (int u = 0; u < SV; ++u) {
                const vf pg = vexp(s[g][u] - vset1(m_new[g]));
                total += vsum(pg);
                vstore(p[g] + u * W, pg);
            }
            l[g] = l[g] * alpha[g] + total;
            m[g] = m_new[g];
            const vf av = vset1(alpha[g]);
            for (int j = 0; j < V; ++j) acc[g][j] = acc[g][j] * av;
        }
        for (int i = 0; i < valid; ++i) {
            vf vv[V];
            for (int j = 0; j < V; ++j) vv[j] = vload(vb + i * HD + j * W);
            for (int g = 0; g < G; ++g) {
                const vf pi = vset1(p[g][i]);
                for (int j = 0; j < V; ++j) acc[g][j] = vfma(pi, vv[j], acc[g][j]);
            }
        }
    }
    for (int g = 0; g < G; ++g) {
        for (int j = 0; j < V; ++j) vstore(acc_out + g * HD + j * W, acc[g][j]);
        m_out[g] = m[g];
        l_out[g] = l[g];
    }
}

// out [G, hd] = the softmax-weighted V over all keys, from `parts` unnormalised parts over
// disjoint key ranges (acc [parts, G, hd], m and l [parts, G]; an empty part has m = -inf).
template <typename T>
static void merge_parts(const float* acc, const float* m, const float* l, int64_t parts,
                        int64_t G, int64_t hd, T* out) {
    for (int64_t g = 0; g < G; ++g) {
        float mx = -INFINITY;
        for (int64_t p = 0; p < parts; ++p) mx = std::max(mx, m[p * G + g]);
        float total = 0.f;
        alignas(64) float o[512];
        for (int64_t d = 0; d < hd; ++d) o[d] = 0.f;
        for (int64_t p = 0; p < parts; ++p) {
            const float wgt = m[p * G + g] == -INFINITY ? 0.f : std::exp(m[p * G + g] - mx);
            total += wgt * l[p * G + g];
            const float* a = acc + (p * G + g) * hd;
            for (int64_t d = 0; d < hd; ++d) o[d] += wgt * a[d];
        }
        const float inv = 1.0f / total;
        for (int64_t d = 0; d < hd; ++d) out[g * hd + d] = from_f<T>(o[d] * inv);
    }
}

template <typename T, typename C = T>
using PartFn = void (*)(const T*, const C*, const C*, const int64_t*, int64_t, int64_t, float,
                        float*, float*, float*);

// The vectorised part kernel for this shape, or null (then attend_row).
template <typename T, typename C = T>
static PartFn<T, C> part_kernel(int64_t bs, int64_t hd, int64_t group) {
    if (bs != 16) return nullptr;
    if (hd == 64 && group == 1) return &attend_part<T, C, 1, 64>;
    if (hd == 64 && group == 2) return &attend_part<T, C, 2, 64>;
    if (hd == 64 && group == 3) return &attend_part<T, C, 3, 64>;
    if (hd == 64 && group == 4) return &attend_part<T, C, 4, 64>;
    if (hd == 128 && group == 1) return &attend_part<T, C, 1, 128>;
    if (hd == 128 && group == 4) return &attend_part<T, C, 4, 128>;
    if (hd == 128 && group == 8) return &attend_part<T, C, 8, 128>;
    return nullptr;
}

// Keys per part: a row's keys are split into parts of this many blocks at fixed offsets
// (part s covers blocks s * PART_BLOCKS ..), and the parts are merged in order. A row's
// result then depends on its own keys only, never on which rows share its step or on the
// thread count: a prompt's last tokens attend the same whether their prefix was computed
// in this step or taken from the prefix cache, so the cache never changes a greedy
// answer. 32 blocks (512 keys): a step whose rows have at most 512 keys runs whole
// (row, KV head) items as before; smaller parts cost batches their merge (measured on
// an AMD EPYC with AVX-512, 2 threads, against the split chosen by the row count: 8
// blocks 1.16-1.32x at 64 rows, 32 blocks 0.93-1.11x; one decode 1.12-1.18x at 300-1000
// keys, where 3 KV heads no longer split across 2 threads).
constexpr int64_t PART_BLOCKS = 32;

// Parts per (row, KV head) in a step whose longest row has max_len keys (shorter rows
// leave their last parts empty; an empty part adds exactly nothing in merge_parts).
static inline int64_t attention_splits(int64_t max_len, int64_t bs, bool vectorised) {
    if (!vectorised) return 1;
    const int64_t blocks = (max_len + bs - 1) / bs;
    return std::max<int64_t>(1, (blocks + PART_BLOCKS - 1) / PART_BLOCKS);
}

// Scratch floats one thread needs (attend_row's buffer), and the shared floats the split
// parts need, for paged_attention_rows.
static inline int64_t attention_scratch(int64_t group, int64_t hd, int64_t max_len, int64_t bs) {
    return group * (2 * hd + (max_len + bs - 1) / bs * bs);
}
static inline int64_t attention_parts_size(int64_t n, int64_t heads, int64_t hd, int64_t splits) {
    return splits > 1 ? n * heads * splits * (hd + 2) : 0;
}

// Row r attends over positions 0 .. lens[r] - 1 of sequence seqs[r], whose blocks are
// tables[seqs[r] * max_blocks ..]; it is row row_ids[r] of q and out (row r where row_ids
// is null). q, out: [rows, heads, hd]; k: [kv_heads, num_blocks, hd,
// bs]; v: [kv_heads, num_blocks, bs, hd], in the cache's type C. scratch: this thread's
// attention_scratch floats; parts: attention_parts_size floats shared by the region
// (unused when splits is 1).
template <typename T, typename C = T>
static void paged_attention_rows(const T* q, const C* k, const C* v, const int64_t* tables,
                                 const int64_t* seqs, const int64_t* lens, T* out, int64_t n,
                                 int64_t heads, int64_t kv_heads, int64_t hd,
                                 int64_t num_blocks, int64_t bs, int64_t max_blocks,
                                 int64_t max_len, float scale, int64_t splits, float* scratch,
                                 float* parts, const int64_t* row_ids = nullptr) {
    const int64_t group = heads / kv_heads;
    const int64_t head_stride = num_blocks * bs * hd;
    const PartFn<T, C> part = part_kernel<T, C>(bs, hd, group);
    // Whole (row, KV head) items and parts go 4 to a chunk.
    if (part == nullptr) {
        #pragma omp for collapse(2) schedule(dynamic, 4)
        for (int64_t r = 0; r < n; ++r) {
            for (int64_t kh = 0; kh < kv_heads; ++kh) {
                const int64_t off = ((row_ids ? row_ids[r] : r) * heads + kh * group) * hd;
                attend_row(q + off, k + kh * head_stride, v + kh * head_stride,
                           tables + seqs[r] * max_blocks, lens[r], scale, group, hd, bs,
                           scratch, max_len, out + off);
            }
        }
        return;
    }
    if (splits == 1) {
        #pragma omp for collapse(2) schedule(dynamic, 4)
        for (int64_t r = 0; r < n; ++r) {
            for (int64_t kh = 0; kh < kv_heads; ++kh) {
                const int64_t off = ((row_ids ? row_ids[r] : r) * heads + kh * group) * hd;
                float* acc = scratch;  // [group, hd], then m and l [group]
                part(q + off, k + kh * head_stride, v + kh * head_stride,
                     tables + seqs[r] * max_blocks, 0, lens[r], scale, acc, acc + group * hd,
                     acc + group * (hd + 1));
                merge_parts(acc, acc + group * hd, acc + group * (hd + 1), 1, group, hd,
                            out + off);
            }
        }
        return;
    }
    // parts: acc [n, kv_heads, splits, group, hd], then m and l [n, kv_heads, splits, group].
    float* acc = parts;
    float* m = acc + n * heads * splits * hd;
    float* l = m + n * heads * splits;
    #pragma omp for collapse(3) schedule(dynamic, 4)
    for (int64_t r = 0; r < n; ++r) {
        for (int64_t kh = 0; kh < kv_heads; ++kh) {
            for (int64_t s = 0; s < splits; ++s) {
                const int64_t begin = std::min(lens[r], s * PART_BLOCKS * bs);
                const int64_t end = std::min(lens[r], (s + 1) * PART_BLOCKS * bs);
                const int64_t item = (r * kv_heads + kh) * splits + s;
                const int64_t off = ((row_ids ? row_ids[r] : r) * heads + kh * group) * hd;
                part(q + off, k + kh * head_stride, v + kh * head_stride,
                     tables + seqs[r] * max_blocks, begin, end, scale, acc + item * group * hd,
                     m + item * group, l + item * group);
            }
        }
    }
    #pragma omp for collapse(2)
    for (int64_t r = 0; r < n; ++r) {
        for (int64_t kh = 0; kh < kv_heads; ++kh) {
            const int64_t item = (r * kv_heads + kh) * splits;
            merge_parts(acc + item * group * hd, m + item * group, l + item * group, splits,
                        group, hd, out + ((row_ids ? row_ids[r] : r) * heads + kh * group) * hd);
        }
    }
}

// ---------------------------------------------------------------- compact projections
// y = residual + x W^T for the float32 model with W stored in fewer bytes, for the few
// rows of a decode step, where a projection should only wait for its weights:
//   int8:     w [n / 16, k / 4, 16, 4] int8 (each block of 16 outputs is one contiguous
//             stream, 4 inputs of an output adjacent, as a step of the dot
//             products takes them) and scales [n / 16, k / QGROUP, 16] float32, W[o, i] = w * scale
//             of i's group of QGROUP inputs. x is quantised per row and
//             group in int16 (symmetric, scale max|x| / 32767; vec.h says why not
//             int8), the products summed exactly in int32 per group and scaled once
//             per group in float32: widening int8 weights to float32 for FMAs made
//             the product compute-bound below the memory's rate on AVX2 (11.5 GB/s on
//             Zen 1);
//   bfloat16: w [n / 16, k, 16] bfloat16, no scales, x float32, float32 sums.
constexpr int64_t QGROUP = Q_GROUP;
constexpr int NV = 16 / W;  // vectors per block of 16 outputs
constexpr int MAX_R = 4;    // rows per pass over a block (the block stays in L1 between)

// The R rows' sums over one block of 16 outputs of bfloat16 weights.
template <int R>
static inline void block_rows_bf16(const bf16* wb, const float* x, int64_t k, float (*acc)[16]) {
    // With one row, two partial sums over alternate inputs: one would be a chain of
    // dependent FMAs whose latency, not the memory, would set the pace.
    constexpr int P = R == 1 ? 2 : 1;
    vf part[P][R][NV];
    for (int p = 0; p < P; ++p)
        for (int r = 0; r < R; ++r)
            for (int u = 0; u < NV; ++u) part[p][r][u] = vzero();
    for (int64_t i = 0; i < k; i += P) {
        for (int p = 0; p < P; ++p) {
            const bf16* wi = wb + (i + p) * 16;
            for (int u = 0; u < NV; ++u) {
                const vf wv = vload(wi + u * W);
                for (int r = 0; r < R; ++r)
                    part[p][r][u] = vfma(vset1(x[r * k + i + p]), wv, part[p][r][u]);
            }
        }
    }
    for (int r = 0; r < R; ++r) {
        for (int u = 0; u < NV; ++u) {
            vf sum = part[0][r][u];
            for (int p = 1; p < P; ++p) sum = sum + part[p][r][u];
            vstore(acc[r] + u * W, sum);
        }
    }
}

// The R rows' sums over one block of 16 outputs of int8 weights (wb, its scales sb) and
// int16 activations (xq [R, k] with scales xs [R, k / QGROUP]). The float totals live in
// acc (L1), touched once per group: kept in registers with the int32 sums, they pushed
// a sum out to the stack, whose store-to-load latency then set the pace.
template <int R>
static inline void block_rows_int8(const int8_t* wb, const float* sb, const int16_t* xq,
                                   const float* xs, int64_t k, float (*acc)[16]) {
    const int64_t groups = k / QGROUP;
    for (int r = 0; r < R; ++r)
        for (int o = 0; o < 16; ++o) acc[r][o] = 0.f;
    for (int64_t g = 0; g < groups; ++g) {
        qacc part[R];
        for (int r = 0; r < R; ++r) q_zero(part[r]);
        const int8_t* wg = wb + g * QGROUP * 16;
        for (int64_t s = 0; s < QGROUP / 4; ++s)
            q_dot<R>(part, wg + s * 64, xq + g * QGROUP + s * 4, k);
        for (int r = 0; r < R; ++r) q_fma(acc[r], part[r], sb + g * 16, xs[r * groups + g]);
    }
}

// x: [rows, k] float32; out (and residual, unless null): [rows, n]; n a multiple of 16,
// k of QGROUP (int8) or of 2 (bfloat16). `rows_of(b, r0, m, acc)` fills acc[0 .. m) with
// rows r0 .. r0 + m of block b. out may be residual (each value is read, then written,
// by the same thread).
template <typename RowsOf>
static void compact_rows(const float* residual, float* out, int64_t rows, int64_t n,
                         RowsOf rows_of) {
    const int64_t blocks = n / 16;
    // Each thread takes one contiguous range of blocks: one sequential stream of weights.
    #pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
        for (int64_t r0 = 0; r0 < rows; r0 += MAX_R) {
            const int m = (int)std::min<int64_t>(MAX_R, rows - r0);
            alignas(64) float acc[MAX_R][16];
            rows_of(b, r0, m, acc);
            for (int r = 0; r < m; ++r) {
                float* o = out + (r0 + r) * n + b * 16;
                const float* res = residual ? residual + (r0 + r) * n + b * 16 : nullptr;
                for (int u = 0; u < NV; ++u) {
                    vf y = vload(acc[r] + u * W);
                    if (res) y = y + vload(res + u * W);
                    vstore(o + u * W, y);
                }
            }
        }
    }
}

// The int8 projection's activations: x [rows, k] quantised per row and group into xq
// [rows, k] with scales xs [rows, k / QGROUP]; about a microsecond a row next to the
// n * k weights every row meets.
static void quantize_rows(const float* x, int64_t rows, int64_t k, int16_t* xq, float* xs) {
    #pragma omp for
    for (int64_t j = 0; j < rows * (k / QGROUP); ++j) xs[j] = qx_quantize(x + j * QGROUP, xq + j * QGROUP);
}

// y = residual + x W^T over int8 weights (w, scales) of x already quantised (xq, xs).
static void linear_int8_rows(const int8_t* w, const float* scales, const int16_t* xq,
                             const float* xs, const float* residual, float* out, int64_t rows,
                             int64_t n, int64_t k) {
    const int64_t groups = k / QGROUP;
    compact_rows(residual, out, rows, n, [=](int64_t b, int64_t r0, int m, float (*acc)[16]) {
        const int8_t* wb = w + b * k * 16;
        const float* sb = scales + b * groups * 16;
        for (int r = 0; r < m; r += Q_ROWS) {
            const int16_t* xr = xq + (r0 + r) * k;
            const float* sr = xs + (r0 + r) * groups;
            switch (std::min(m - r, Q_ROWS)) {
                case 1: block_rows_int8<1>(wb, sb, xr, sr, k, acc + r); break;
                case 2: block_rows_int8<2>(wb, sb, xr, sr, k, acc + r); break;
                case 3: block_rows_int8<3>(wb, sb, xr, sr, k, acc + r); break;
                default: block_rows_int8<4>(wb, sb, xr, sr, k, acc + r); break;
            }
        }
    });
}

static void linear_bf16w_rows(const bf16* w, const float* x, const float* residual, float* out,
                              int64_t rows, int64_t n, int64_t k) {
    compact_rows(residual, out, rows, n, [=](int64_t b, int64_t r0, int m, float (*acc)[16]) {
        const bf16* wb = w + b * k * 16;
        const float* xr = x + r0 * k;
        switch (m) {
            case 1: block_rows_bf16<1>(wb, xr, k, acc); break;
            case 2: block_rows_bf16<2>(wb, xr, k, acc); break;
            case 3: block_rows_bf16<3>(wb, xr, k, acc); break;
            default: block_rows_bf16<4>(wb, xr, k, acc); break;
        }
    });
}

// One token drawn from softmax(x * inv_temp) over a row of ``vocab`` float32 logits by
// ``u`` in [0, 1): the first token whose running sum of exps passes u times their total.
// Exps are summed in blocks of W (horizontal sum in float, accumulated in double), the
// same way for the total and for the walk, so the walk reaches the target inside a
// block, where it adds that block's exps one by one. A token of weight 0 (a masked -inf,
// or an exp below float's range) is never picked; where rounding leaves the target
// uncrossed (u within about 1e-7 of 1), the row takes its last token of nonzero weight,
// as the torch path's target clamped under the total does.
static inline int64_t sample_row(const float* x, int64_t vocab, float inv_temp, double u) {
    vf m = vset1(-INFINITY);
    int64_t i = 0;
    for (; i + W <= vocab; i += W) m = vmax(m, vload(x + i));
    float mx = i > 0 ? vhmax(m) : -INFINITY;
    for (int64_t j = i; j < vocab; ++j) mx = std::max(mx, x[j]);
    const vf vmx = vset1(mx), vt = vset1(inv_temp);
    double total = 0.0;
    for (i = 0; i + W <= vocab; i += W) total += (double)vsum(vexp((vload(x + i) - vmx) * vt));
    for (int64_t j = i; j < vocab; ++j) total += (double)fast_exp((x[j] - mx) * inv_temp);
    const double target = u * total;
    double run = 0.0;
    for (i = 0; i + W <= vocab; i += W) {
        const vf e = vexp((vload(x + i) - vmx) * vt);
        const double s = (double)vsum(e);
        if (run + s <= target) {
            run += s;
            continue;
        }
        float lanes[W];
        vstore(lanes, e);
        for (int j = 0; j < W; ++j) {
            run += (double)lanes[j];
            if (lanes[j] > 0.0f && run > target) return i + j;
        }
    }
    for (int64_t j = i; j < vocab; ++j) {
        const float e = fast_exp((x[j] - mx) * inv_temp);
        run += (double)e;
        if (e > 0.0f && run > target) return j;
    }
    for (int64_t j = vocab - 1; j > 0; --j)
        if (fast_exp((x[j] - mx) * inv_temp) > 0.0f) return j;
    return 0;
}
