// The AMX build's projections: bfloat16 weights and activations on AMX tiles. Only the
// `amx` variant compiles this file (kernel_build.py); it needs AMX-TILE, AMX-BF16 and
// AVX-512 at compile time.
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <vector>

#include "stack.h"
#include "tile_attention.h"

#if !(defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512F__))
#error "tile_linear.cpp is built only with AMX-TILE, AMX-BF16 and AVX-512 enabled"
#endif

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
struct TileConfig {
    uint8_t palette = 1, start_row = 0, reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
};

// While a ProjectionTiles lives, its thread has the projections' tile configuration
// (tiles 0-3: C for two row blocks x two output blocks, float32 16 x 16; 4-5: A, the two
// row blocks' 16 x 32 inputs; 6-7: B, the two output blocks' 16 pairs x 16). The thread
// is torch's: other AMX code on it (oneDNN's brgemm kernels, which PyTorch's CPU flash
// attention calls through a per-thread cache that skips the configuration while it
// believes its own is loaded: `Brgemm::get_current()` in aten/src/ATen/native/CPUBlas.cpp)
// may keep a configuration loaded between its calls. So it keeps whatever was loaded and
// puts it back at the end: a kernel leaves the thread's tile state as it found it
// (STTILECFG stores zeros in the INIT state).
struct ProjectionTiles {
    alignas(64) TileConfig saved;
    ProjectionTiles() {
        _tile_storeconfig(&saved);
        TileConfig cfg;
        for (int t = 0; t < 8; ++t) cfg.rows[t] = 16, cfg.colsb[t] = 64;
        _tile_loadconfig(&cfg);
    }
    ~ProjectionTiles() {
        if (saved.palette != 0)
            _tile_loadconfig(&saved);
        else
            _tile_release();
    }
    ProjectionTiles(const ProjectionTiles&) = delete;
    ProjectionTiles& operator=(const ProjectionTiles&) = delete;
};

// The projection, shared by the threads of the enclosing parallel region (each takes
// its own range of outputs; no barrier at the end), with the projections' tile
// configuration loaded on each. a: [padded_rows, k], a multiple of 16 rows. Gated: w is
// a gate/up projection in Linear.gated_tile_weight's layout and out [rows, n / 2] gets
// rnd(rnd(silu(gate)) * up) of the rounded products, as silu_mul_rows computes it from
// them once stored (no residual): the n outputs are never written.
template <bool Gated = false>
static void tile_linear_rows(const bf16* w, const bf16* a, const bf16* residual, bf16* out,
                             int64_t rows, int64_t padded_rows, int64_t n, int64_t k) {
    const int64_t blocks = n / 16, pairs = (blocks + 1) / 2, steps = k / 32;
    // A 32 x 32 block of outputs, stored from the C tiles, whose rounding (and residual,
    // or SiLU) is still to do. It is done a few rows at a time between the next block's
    // tile products, which leave the vector units idle: done after its own products it
    // kept the tiles waiting, and the projections ran about 20% under oneDNN's at 2,048
    // rows.
    struct Stored {
        alignas(64) float c[4][16][16];
        int64_t m0 = -1, p = 0;  // m0 -1: nothing stored
    } stored[2];
    const int64_t rows_a_step = (32 + steps - 1) / steps;
    // Rows e0 .. e1 - 1 of a stored block (row e: row block e / 16, row e % 16 in it).
    auto finish = [&](const Stored& b, int64_t e0, int64_t e1) {
        const int64_t nb = 2 * b.p;
        const bool two_n = nb + 1 < blocks;
        for (int64_t e = e0; e < e1; ++e) {
            const int64_t mi = e / 16, r = e % 16, row = b.m0 + e;
            if (row >= rows) return;
            if constexpr (Gated) {
                // Output blocks nb (gates) and nb + 1 (what they gate) are outputs p * 16
                // .. p * 16 + 15 of out.
                const vf g = vround<bf16>(vload(b.c[mi * 2][r]));
                const vf act = vround<bf16>(g * vrecip(vset1(1.0f) + vexp(vzero() - g)));
                vstore(out + row * (n / 2) + b.p * 16, act * vround<bf16>(vload(b.c[mi * 2 + 1][r])));
            } else {
                for (int ni = 0; ni < (two_n ? 2 : 1); ++ni) {
                    const int64_t col = (nb + ni) * 16;
                    vf y = vload(b.c[mi * 2 + ni][r]);
                    if (residual) y = y + vload(residual + row * n + col);
                    vstore(out + row * n + col, y);
                }
            }
        }
    };
    int cur = 0;  // the block being computed stores into stored[cur]
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
                const Stored& prev = stored[cur ^ 1];
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
                    if (prev.m0 >= 0)
                        finish(prev, std::min<int64_t>(32, s * rows_a_step),
                               std::min<int64_t>(32, (s + 1) * rows_a_step));
                }
                stored[cur ^ 1].m0 = -1;
                Stored& mine = stored[cur];
                _tile_stored(0, mine.c[0], 64);
                _tile_stored(1, mine.c[1], 64);
                _tile_stored(2, mine.c[2], 64);
                _tile_stored(3, mine.c[3], 64);
                mine.m0 = m0;
                mine.p = p;
                cur ^= 1;
            }
        }
    }
    if (stored[cur ^ 1].m0 >= 0) finish(stored[cur ^ 1], 0, 32);
}

template <bool Gated>
static void tile_linear(const bf16* w, const bf16* a, const bf16* residual, bf16* out,
                        int64_t rows, int64_t padded_rows, int64_t n, int64_t k, int threads) {
    #pragma omp parallel num_threads(threads)
    {
        ProjectionTiles tiles;
        tile_linear_rows<Gated>(w, a, residual, out, rows, padded_rows, n, k);
    }
}

// x [rows, k] through w (n outputs) on tiles, rows padded to whole tiles.
template <bool Gated>
static void tile_linear_padded(const bf16* w, const bf16* x, const bf16* residual, bf16* out,
                               int64_t rows, int64_t n, int64_t k, int threads) {
    const int64_t padded_rows = (rows + 15) / 16 * 16;
    if (padded_rows == rows) {
        tile_linear<Gated>(w, x, residual, out, rows, rows, n, k, threads);
        return;
    }
    // A tile reads 16 rows: copy x into a zero-padded buffer kept for the next call.
    thread_local std::vector<bf16> padded;
    padded.resize(padded_rows * k);
    std::memcpy(padded.data(), x, rows * k * sizeof(bf16));
    std::memset(padded.data() + rows * k, 0, (padded_rows - rows) * k * sizeof(bf16));
    tile_linear<Gated>(w, padded.data(), residual, out, rows, padded_rows, n, k, threads);
}

// 1 when the kernel let this process use AMX, else 0.
extern "C" int tile_linear_available() {
    // Linux hands out AMX's tile state only on request: ARCH_REQ_XCOMP_PERM for
    // XFEATURE_XTILEDATA. Once granted, it holds for every thread of the process.
    return syscall(SYS_arch_prctl, 0x1023, 18) == 0 ? 1 : 0;
}

// x: [rows, k], out (and residual, unless null): [rows, n]; n a multiple of 16, k of 32.
extern "C" void tile_linear_bf16(const bf16* w, const bf16* x, const bf16* residual, bf16* out,
                                 int64_t rows, int64_t n, int64_t k, int threads) {
    tile_linear_padded<false>(w, x, residual, out, rows, n, k, threads);
}

// silu(gate) * up of a gate/up projection in Linear.gated_tile_weight's layout (n outputs,
// a multiple of 32): x [rows, k], out [rows, n / 2].
extern "C" void tile_gated_silu_bf16(const bf16* w, const bf16* x, bf16* out, int64_t rows,
                                     int64_t n, int64_t k, int threads) {
    tile_linear_padded<true>(w, x, nullptr, out, rows, n, k, threads);
}

// The decode stack (stack.h) of the bfloat16 model with every projection on AMX tiles:
// the same kernels in the same order as the op-by-op path (rms_norm_bf16, tile_linear_bf16,
// rope_store_bf16, paged_attention_bf16, silu_mul_bf16), the same numbers, over a
// bfloat16 KV cache. Rows run in tiles of 16, so the projections' inputs hold the rows
// padded to 16 (zeros).
extern "C" void decode_stack_bf16_tiles(STACK_ARGS(bf16)) {
    const int64_t padded_rows = (n + 15) / 16 * 16;
    auto project = [&](const void* w, const float*, const bf16* x, const bf16* residual,
                       bf16* out, int64_t n_out, int64_t k) {
        tile_linear_rows(static_cast<const bf16*>(w), x, residual, out, n, padded_rows, n_out,
                         k);
        #pragma omp barrier
    };
    // The gate/up projection in Linear.gated_tile_weight's layout, SiLU as it stores.
    auto project_gated = [&](const void* w, const float*, const bf16* x, bf16* act,
                             int64_t inter2, int64_t k) {
        tile_linear_rows<true>(static_cast<const bf16*>(w), x, nullptr, act, n, padded_rows,
                               inter2, k);
        #pragma omp barrier
    };
    auto attend_runs = [&](const bf16* q, const bf16* k, const bf16* v, bf16* out) {
        tile_attention_runs(q, k, v, tables, runs, num_runs, out, heads, kv_heads, hd,
                            num_blocks, max_blocks, scale);
    };
    // One configuration per thread for the whole step, kept and put back as tile_linear.
    decode_layers<bf16, bf16, ProjectionTiles>(STACK_ARG_NAMES, padded_rows, project,
                                               project_gated, attend_runs);
}

// 1 when tile_attention_bf16 (and the tile stack's runs) take this shape, else 0.
extern "C" int tile_attention_supports(int64_t hd, int64_t group, int64_t bs) {
    return tile_attention_shape(hd, group, bs) ? 1 : 0;
}

// The runs' rows of out [rows, heads, hd] (tile_attention.h), the other rows untouched;
// q as out, caches as paged_attention_bf16's. The shape must be one
// tile_attention_supports takes.
extern "C" void tile_attention_bf16(const bf16* q, const bf16* k, const bf16* v,
                                    const int64_t* tables, const int64_t* runs, int64_t num_runs,
                                    bf16* out, int64_t heads, int64_t kv_heads, int64_t hd,
                                    int64_t num_blocks, int64_t max_blocks, float scale,
                                    int threads) {
    #pragma omp parallel num_threads(threads)
    {
        ProjectionTiles tiles;
        tile_attention_runs(q, k, v, tables, runs, num_runs, out, heads, kv_heads, hd,
                            num_blocks, max_blocks, scale);
    }
}
