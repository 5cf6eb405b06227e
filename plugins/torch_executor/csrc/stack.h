// Every decoder layer of a step in one call, in one parallel region: the ops of ops.h in
// a layer's order, a barrier between each (the end of each op's `omp for`, or the one a
// projection ends with). Run one op at a time from Python, a batch-1 decode step of
// SmolLM2 (30 layers, 9 ops each) spent about a quarter of its time outside the kernels:
// the interpreter, the tensor allocations and a parallel region opened and closed per op.
// stack.cpp runs it over the float32 model's compact weights, tile_linear.cpp over the
// bfloat16 model's AMX tiles.
//
// The layer, as model.decoder_layer computes it:
//   x = rms_norm(h, input_norm); qkv = x Wqkv^T; q = rope_store(qkv)  (K, V into the cache)
//   a = attention(q); h = h + a Wo^T; x = rms_norm(h, post_norm); g = x Wgu^T
//   h = h + silu_mul(g) Wdown^T
#pragma once

#include "ops.h"

// One layer's addresses, as stack.py lays them out: 12 per layer. The norms are of the
// activations' type; the weights in the projection's layout (compact, or AMX tiles).
struct StackLayer {
    const void* input_norm;
    const void* post_norm;
    const void* qkv;
    const float* qkv_scales;  // null but for int8 weights, as for every projection
    const void* o;
    const float* o_scales;
    const void* gate_up;
    const float* gate_up_scales;
    const void* down;
    const float* down_scales;
    void* k_cache;  // of the cache's type C
    void* v_cache;
};
static_assert(sizeof(StackLayer) == 12 * sizeof(int64_t), "12 addresses per layer");

// The export every stack has (stack.py calls it so): h: [n, hidden], the embeddings in,
// the last layer's output out. positions, slots: [n]; cos, sin: [max_len, hd]; tables,
// seqs, lens, max_len: the attention over the cache of the rows row_ids (num_kernel_rows
// of them; every row in order where null) one by one (paged_attention_rows, scores scaled
// by scale); runs, num_runs: the other rows', a prompt chunk's 16 at a time on AMX tiles
// (tile_attention.h; only the tile stack has runs); caches [kv_heads, num_blocks, ...] as
// rope_store_rows.
#define STACK_ARGS(T)                                                                        \
    const int64_t *layer_addresses, int64_t num_layers, T *h, int64_t n, int64_t hidden,     \
        int64_t heads, int64_t kv_heads, int64_t hd, int64_t inter, float eps,               \
        const int64_t *positions, const T *cos, const T *sin, const int64_t *slots,          \
        const int64_t *tables, const int64_t *seqs, const int64_t *lens,                     \
        const int64_t *row_ids, int64_t num_kernel_rows, const int64_t *runs,                \
        int64_t num_runs, int64_t num_blocks,                                                \
        int64_t bs, int64_t max_blocks, int64_t max_len, float scale, int threads
#define STACK_ARG_NAMES                                                                       \
    layer_addresses, num_layers, h, n, hidden, heads, kv_heads, hd, inter, eps, positions,    \
        cos, sin, slots, tables, seqs, lens, row_ids, num_kernel_rows, runs, num_runs,        \
        num_blocks, bs, max_blocks, max_len, scale,                                           \
        threads

// The layers over activations of type T and a cache of type C. `project(w, scales, x,
// residual, out, n_out, k)`, called by every thread of the region, computes out =
// residual + x W^T for the step's n rows (no residual where null) and returns after a
// barrier. The buffers it reads as x hold `padded_rows` (>= n) rows, the rows past n
// zero: a projection may read whole tiles of rows. `project_gated(w, scales, x, act,
// 2 * inter, hidden)`, called by every thread, computes act = silu_mul(x Wgu^T) and
// returns after a barrier. `attend_runs(q, k_cache, v_cache, out)`, called by every
// thread, attends the runs' rows (ending in a barrier). Every thread of the region holds
// a `ThreadState` while it runs the layers (the tile configuration's, for AMX).
struct NoThreadState {};
template <typename T, typename C, typename ThreadState = NoThreadState, typename Project,
          typename ProjectGated, typename AttendRuns>
static void decode_layers(STACK_ARGS(T), int64_t padded_rows, Project project,
                          ProjectGated project_gated, AttendRuns attend_runs) {
    const StackLayer* layers = reinterpret_cast<const StackLayer*>(layer_addresses);
    const int64_t group = heads / kv_heads;
    const int64_t qkv_width = (heads + 2 * kv_heads) * hd;
    const int64_t splits =
        attention_splits(max_len, bs, part_kernel<T, C>(bs, hd, group) != nullptr);
    // Value-initialised: the padding rows stay zero, as the projections' inputs need.
    std::vector<T> x(padded_rows * hidden), qkv(n * qkv_width), q(n * heads * hd);
    std::vector<T> a(padded_rows * heads * hd);
    std::vector<T> act(padded_rows * inter);
    // Every part writes its own slots before the merge reads them: no need to zero.
    std::unique_ptr<float[]> parts(
        new float[attention_parts_size(num_kernel_rows, heads, hd, splits)]);
    #pragma omp parallel num_threads(threads)
    {
        ThreadState state;
        (void)state;
        std::vector<float> scratch(attention_scratch(group, hd, max_len, bs));
        for (int64_t i = 0; i < num_layers; ++i) {
            const StackLayer& L = layers[i];
            rms_norm_rows(h, static_cast<const T*>(L.input_norm), x.data(), n, hidden, eps);
            project(L.qkv, L.qkv_scales, x.data(), nullptr, qkv.data(), qkv_width, hidden);
            C* k_cache = static_cast<C*>(L.k_cache);
            C* v_cache = static_cast<C*>(L.v_cache);
            rope_store_rows(qkv.data(), positions, cos, sin, slots, k_cache, v_cache,
                            q.data(), (T*)nullptr, n, heads, kv_heads, hd, num_blocks, bs);
            paged_attention_rows(q.data(), (const C*)k_cache, (const C*)v_cache, tables, seqs,
                                 lens, a.data(), num_kernel_rows, heads, kv_heads, hd,
                                 num_blocks, bs, max_blocks, max_len, scale, splits,
                                 scratch.data(), parts.get(), row_ids);
            if (num_runs > 0) attend_runs(q.data(), (const C*)k_cache, (const C*)v_cache, a.data());
            project(L.o, L.o_scales, a.data(), h, h, hidden, heads * hd);
            rms_norm_rows(h, static_cast<const T*>(L.post_norm), x.data(), n, hidden, eps);
            project_gated(L.gate_up, L.gate_up_scales, x.data(), act.data(), 2 * inter, hidden);
            project(L.down, L.down_scales, act.data(), h, h, hidden, inter);
        }
    }
}
