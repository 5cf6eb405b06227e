// Causal attention of a prompt chunk's rows on AMX tiles (the `amx` variant only; the
// caller holds the projections' tile configuration, ProjectionTiles: eight tiles of 16
// rows x 64 bytes).
//
// The per-row kernel (attend_part, ops.h) reads a row's whole context for every row: a
// chunk of n rows costs n times its context in vector FMAs, and on 2 threads of a
// Sapphire Rapids Xeon a 256-row prompt's attention took as long as SDPA's. Here 16 rows
// of one sequence share each key: Q K^T and P V are tile products over 32 keys at a
// time (two cache blocks), with the online softmax (running max and sum per row) in
// AVX-512 between them, so each row's result depends on its own query and keys only,
// never on which rows share its tile or its step.
//
// Numerics: scores and the running sums in float32 (exact bfloat16 products, float32
// sums); the probabilities go into the P V product as two bfloat16 terms, P = hi + lo
// (about 2^-17 relative), so that each row is the per-row kernel's float32 attention but
// for the order of its sums. Rounding P to bfloat16 once, as PyTorch's CPU flash
// attention does, costs half as many P V products but is off by 2^-9 per probability:
// enough to turn SmolLM2-135M's greedy answer to the README's question from "The capital
// of France is Paris." to "L'Etoile, la Marseillaise, ...". Rows that must attend alike
// bit for bit wherever they are computed (a prompt's last block, which the prefix cache
// recomputes) stay on the per-row kernel (SequenceSlice.first_kernel_row).
#pragma once

#include <immintrin.h>

#include "ops.h"

static_assert(W == 16, "the tiles' rows of 16 floats are one vector each");

// The tile layouts: a B tile holds 16 rows of 16 pairs (32 bfloat16 = 64 bytes) whose
// row i interleaves two source rows, element j of each at 2j and 2j + 1.
static inline void interleave_rows(const bf16* a, const bf16* b, bf16* out) {
    const __m512i idx = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41,
                                         9, 40, 8, 39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2,
                                         33, 1, 32, 0);
    const __m512i lo = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i*)a));
    const __m512i hi = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i*)b));
    _mm512_storeu_si512(out, _mm512_permutex2var_epi16(lo, idx, hi));
}

// 2^x for x <= 0 (x = -inf gives 0), within about 2e-7 relative: x = n + f with n an
// integer and |f| <= 1/2, 2^f by a degree-6 polynomial, scaled by 2^n. About half the
// instructions of vexp, and finer than the P V product's two bfloat16 terms (2^-17).
static inline __m512 exp2_nonpositive(__m512 x) {
    const __m512 xc = _mm512_max_ps(x, _mm512_set1_ps(-127.0f));
    const __m512 n = _mm512_roundscale_ps(xc, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(xc, n);
    __m512 y = _mm512_set1_ps(1.5403530e-4f);                    // ln2^6 / 720
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.3333558e-3f));     // ln2^5 / 120
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(9.6181291e-3f));     // ln2^4 / 24
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(5.5504109e-2f));     // ln2^3 / 6
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(2.4022651e-1f));     // ln2^2 / 2
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(6.9314718e-1f));     // ln2
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.0f));
    const __m512 result = _mm512_scalef_ps(y, n);
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(-127.0f), _CMP_GE_OQ), result);
}

// Rows first_row .. first_row + num_rows - 1 of q, at positions start .. start + num_rows
// - 1 of the sequence whose blocks are `table`, attend causally over its cached keys
// (rope_store has written the chunk's own K and V): out [rows, heads, HD] as q. k: [kv_heads,
// num_blocks, HD, 16] (each block transposed), v: [kv_heads, num_blocks, 16, HD]. One item
// is 16 rows x one KV head; the `group` query heads sharing the KV head run together, so
// each K/V block is laid out for the tiles once per item.
template <int HD>
static void tile_attend_item(const bf16* q, const bf16* k, const bf16* v, const int64_t* table,
                             int64_t first_row, int64_t rows, int64_t pos0, int64_t kh,
                             int64_t heads, int64_t group, float scale, bf16* out) {
    static_assert(HD % 64 == 0, "the P V product writes HD / 16 output tiles");
    // KC keys a chunk: four cache blocks, one C tile of scores each.
    constexpr int BS = 16, KB = 4, KC = KB * BS, QS = HD / 32, OT = HD / 16;
    const int64_t ctx = pos0 + rows;  // keys the last row sees
    const float scale2 = scale * 1.44269504088896341f;  // scores in base 2
    alignas(64) bf16 qt[8][16][HD];         // the group's queries, padded rows zero
    alignas(64) bf16 kt[KB][QS][16][32];    // each block's K^T, per 32 dims
    alignas(64) bf16 vt[OT][KC / 2][32];    // the chunk's V, per 16 outputs
    alignas(64) float s[16][KC];            // one head's scores
    alignas(64) bf16 p[16][KC];             // its probabilities, rounded to bfloat16
    alignas(64) bf16 p_lo[16][KC];          // and what that rounding left off
    alignas(64) float o_part[16][HD];
    alignas(64) float o[8][16][HD];
    alignas(64) float m[8][16], l[8][16];
    for (int64_t g = 0; g < group; ++g) {
        const int64_t h = kh * group + g;
        for (int r = 0; r < 16; ++r) {
            if (r < rows)
                std::memcpy(qt[g][r], q + ((first_row + r) * heads + h) * HD, HD * sizeof(bf16));
            else
                std::memset(qt[g][r], 0, HD * sizeof(bf16));
            for (int d = 0; d < HD; ++d) o[g][r][d] = 0.f;
            m[g][r] = -INFINITY;
            l[g][r] = 0.f;
        }
    }
    for (int64_t kc = 0; kc < ctx; kc += KC) {
        for (int b = 0; b < KB; ++b) {
            const int64_t t0 = kc + b * BS;
            if (t0 >= ctx) {  // past the context: no block to read, zeros in its place
                std::memset(kt[b], 0, sizeof(kt[b]));
                for (int j = 0; j < OT; ++j) std::memset(vt[j][b * 8], 0, 8 * 32 * sizeof(bf16));
                continue;
            }
            const int64_t block = table[t0 / BS];
            const bf16* kb = k + block * HD * BS;  // [HD, 16]
            const bf16* vb = v + block * BS * HD;  // [16, HD]
            for (int st = 0; st < QS; ++st)
                for (int i = 0; i < 16; ++i)
                    interleave_rows(kb + (st * 32 + 2 * i) * BS, kb + (st * 32 + 2 * i + 1) * BS,
                                    kt[b][st][i]);
            for (int j = 0; j < OT; ++j)
                for (int i = 0; i < 8; ++i)
                    interleave_rows(vb + 2 * i * HD + j * 16, vb + (2 * i + 1) * HD + j * 16,
                                    vt[j][b * 8 + i]);
        }
        for (int64_t g = 0; g < group; ++g) {
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (int st = 0; st < QS; ++st) {
                _tile_loadd(4, &qt[g][0][st * 32], HD * sizeof(bf16));
                _tile_loadd(6, kt[0][st], 64);
                _tile_dpbf16ps(0, 4, 6);
                _tile_loadd(7, kt[1][st], 64);
                _tile_dpbf16ps(1, 4, 7);
                _tile_loadd(6, kt[2][st], 64);
                _tile_dpbf16ps(2, 4, 6);
                _tile_loadd(7, kt[3][st], 64);
                _tile_dpbf16ps(3, 4, 7);
            }
            _tile_stored(0, &s[0][0], KC * sizeof(float));
            _tile_stored(1, &s[0][16], KC * sizeof(float));
            _tile_stored(2, &s[0][32], KC * sizeof(float));
            _tile_stored(3, &s[0][48], KC * sizeof(float));
            // Per row: the new running max, the probabilities under it and their sum;
            // then the 16 rows' rescale factors exp(old max - new max) in one vector.
            // Scores are kept in base 2 (times log2 e), so each exp is an exp2.
            alignas(64) float mx[16], total[16];
            for (int r = 0; r < 16; ++r) {
                // Keys the row sees in this chunk; padded rows see what the last row sees.
                const int sees = (int)(std::min<int64_t>(pos0 + r, ctx - 1) + 1 - kc);
                vf sv[KB];
                vf mv = vset1(m[g][r]);
                for (int b = 0; b < KB; ++b) {
                    sv[b] = vfirst(vload(s[r] + b * BS) * vset1(scale2), sees - b * BS, -INFINITY);
                    mv = vmax(mv, sv[b]);
                }
                // The first chunk holds key 0, which every row sees: the max is finite.
                mx[r] = vhmax(mv);
                vf sum = vzero();
                for (int b = 0; b < KB; ++b) {
                    const vf pb = {exp2_nonpositive((sv[b] - vset1(mx[r])).v)};
                    sum = sum + pb;
                    const vf hi = vround<bf16>(pb);
                    vstore(p[r] + b * BS, hi);
                    vstore(p_lo[r] + b * BS, pb - hi);  // exact in float32
                }
                total[r] = vsum(sum);
            }
            alignas(64) float alpha[16];  // 0 on the first chunk (old max -inf)
            vstore(alpha, vf{exp2_nonpositive((vload(m[g]) - vload(mx)).v)});
            vstore(l[g], vload(l[g]) * vload(alpha) + vload(total));
            std::memcpy(m[g], mx, sizeof(mx));
            // P's two terms stay in tiles 2-5 over the whole row of outputs; two output
            // tiles at a time (tile numbers are immediates), each over both terms.
            _tile_loadd(2, &p[0][0], KC * sizeof(bf16));
            _tile_loadd(3, &p[0][32], KC * sizeof(bf16));
            _tile_loadd(4, &p_lo[0][0], KC * sizeof(bf16));
            _tile_loadd(5, &p_lo[0][32], KC * sizeof(bf16));
            for (int j = 0; j < OT; j += 2) {
                _tile_zero(0);
                _tile_zero(1);
#define PV_TILE(C)                                          \
    _tile_loadd(6, vt[j + C][0], 64);                       \
    _tile_dpbf16ps(C, 2, 6);                                \
    _tile_dpbf16ps(C, 4, 6);                                \
    _tile_loadd(7, vt[j + C][16], 64);                      \
    _tile_dpbf16ps(C, 3, 7);                                \
    _tile_dpbf16ps(C, 5, 7);                                \
    _tile_stored(C, &o_part[0][(j + C) * 16], HD * sizeof(float))
                PV_TILE(0);
                PV_TILE(1);
#undef PV_TILE
            }
            for (int r = 0; r < 16; ++r) {
                const vf a = vset1(alpha[r]);
                for (int d = 0; d < HD; d += W)
                    vstore(o[g][r] + d, vfma(vload(o[g][r] + d), a, vload(o_part[r] + d)));
            }
        }
    }
    for (int64_t g = 0; g < group; ++g) {
        const int64_t h = kh * group + g;
        for (int r = 0; r < rows; ++r) {
            const vf inv = vset1(1.0f / l[g][r]);
            bf16* dst = out + ((first_row + r) * heads + h) * HD;
            for (int d = 0; d < HD; d += W) vstore(dst + d, vload(o[g][r] + d) * inv);
        }
    }
}

// Whether tile_attention_runs takes this shape: head_dim 64 or 128, at most 8 query heads
// per KV head, 16-token blocks.
static inline bool tile_attention_shape(int64_t hd, int64_t group, int64_t bs) {
    return (hd == 64 || hd == 128) && group >= 1 && group <= 8 && bs == 16;
}

// Every run's rows, shared by the threads of the enclosing parallel region (an orphaned
// `omp for`, ending in a barrier). runs: [num_runs, 4] = (first row, rows, row of
// `tables`, position of the first row); the runs' rows are disjoint. The shape is one
// tile_attention_shape takes.
static void tile_attention_runs(const bf16* q, const bf16* k, const bf16* v,
                                const int64_t* tables, const int64_t* runs, int64_t num_runs,
                                bf16* out, int64_t heads, int64_t kv_heads, int64_t hd,
                                int64_t num_blocks, int64_t max_blocks, float scale) {
    const int64_t group = heads / kv_heads, head_stride = num_blocks * 16 * hd;
    int64_t items = 0;
    for (int64_t i = 0; i < num_runs; ++i) items += (runs[4 * i + 1] + 15) / 16;
    #pragma omp for collapse(2) schedule(dynamic, 1)
    for (int64_t item = 0; item < items; ++item) {
        for (int64_t kh = 0; kh < kv_heads; ++kh) {
            // The item's run and 16-row block within it.
            int64_t i = 0, b = item;
            while (b >= (runs[4 * i + 1] + 15) / 16) b -= (runs[4 * i + 1] + 15) / 16, ++i;
            const int64_t* run = runs + 4 * i;
            const int64_t rows = std::min<int64_t>(16, run[1] - 16 * b);
            auto attend = hd == 64 ? &tile_attend_item<64> : &tile_attend_item<128>;
            attend(q, k + kh * head_stride, v + kh * head_stride, tables + run[2] * max_blocks,
                   run[0] + 16 * b, rows, run[3] + 16 * b, kh, heads, group, scale, out);
        }
    }
}
