// Every decoder layer of a small float32 step over compact weights in one call, in one
// parallel region: the ops of ops.h in a layer's order, a barrier between each (the end
// of each op's `omp for`). Run one op at a time from Python, a batch-1 decode step of
// SmolLM2 (30 layers, 9 ops each) spent about a quarter of its time outside the kernels:
// the interpreter, the tensor allocations and a parallel region opened and closed per op.
//
// The layer, as model.decoder_layer computes it:
//   x = rms_norm(h, input_norm); qkv = x Wqkv^T; q = rope_store(qkv)  (K, V into the cache)
//   a = attention(q); h = h + a Wo^T; x = rms_norm(h, post_norm); g = x Wgu^T
//   h = h + silu_mul(g) Wdown^T
#include "ops.h"

namespace {

// One layer's addresses, as StackLayout (native.py) lays them out: 12 per layer.
struct Layer {
    const float* input_norm;
    const float* post_norm;
    const void* qkv;
    const float* qkv_scales;  // null for bfloat16 weights, as for every projection
    const void* o;
    const float* o_scales;
    const void* gate_up;
    const float* gate_up_scales;
    const void* down;
    const float* down_scales;
    void* k_cache;  // float, or bfloat16 (decode_stack_f32_bf16kv)
    void* v_cache;
};
static_assert(sizeof(Layer) == 12 * sizeof(int64_t), "12 addresses per layer");

// y = residual + x W^T in the layer's weight format; xq, xs: the int8 activations' buffers.
void project(const void* w, const float* scales, const float* x, const float* residual,
             float* out, int64_t rows, int64_t n, int64_t k, int16_t* xq, float* xs) {
    if (scales != nullptr) {
        quantize_rows(x, rows, k, xq, xs);
        linear_int8_rows(static_cast<const int8_t*>(w), scales, xq, xs, residual, out, rows, n, k);
    } else {
        linear_bf16w_rows(static_cast<const bf16*>(w), x, residual, out, rows, n, k);
    }
}

}  // namespace

// h: [n, hidden], the embeddings in, the last layer's output out. positions, slots:
// [n]; cos, sin: [max_len, hd]; tables, seqs, lens, max_len: every row's attention over
// the cache (paged_attention_rows, scores scaled by scale); caches [kv_heads, num_blocks,
// ...] as rope_store_rows, of type C.
template <typename C>
static void decode_stack(const int64_t* layer_addresses, int64_t num_layers, float* h,
                         int64_t n, int64_t hidden, int64_t heads, int64_t kv_heads, int64_t hd,
                         int64_t inter, float eps, const int64_t* positions, const float* cos,
                         const float* sin, const int64_t* slots, const int64_t* tables,
                         const int64_t* seqs, const int64_t* lens, int64_t num_blocks,
                         int64_t bs, int64_t max_blocks, int64_t max_len, float scale,
                         int threads) {
    const Layer* layers = reinterpret_cast<const Layer*>(layer_addresses);
    const int64_t group = heads / kv_heads;
    const int64_t qkv_width = (heads + 2 * kv_heads) * hd;
    const int64_t splits =
        attention_splits(max_len, bs, part_kernel<float, C>(bs, hd, group) != nullptr);
    const int64_t widest = std::max({hidden, heads * hd, inter});
    std::vector<float> x(n * hidden), qkv(n * qkv_width), q(n * heads * hd), a(n * heads * hd);
    std::vector<float> gate_up(n * 2 * inter), act(n * inter), xs(n * (widest / QGROUP + 1));
    std::vector<int16_t> xq(n * widest);
    // Every part writes its own slots before the merge reads them: no need to zero.
    std::unique_ptr<float[]> parts(new float[attention_parts_size(n, heads, hd, splits)]);
    #pragma omp parallel num_threads(threads)
    {
        std::vector<float> scratch(attention_scratch(group, hd, max_len, bs));
        for (int64_t i = 0; i < num_layers; ++i) {
            const Layer& L = layers[i];
            rms_norm_rows(h, L.input_norm, x.data(), n, hidden, eps);
            project(L.qkv, L.qkv_scales, x.data(), nullptr, qkv.data(), n, qkv_width, hidden,
                    xq.data(), xs.data());
            C* k_cache = static_cast<C*>(L.k_cache);
            C* v_cache = static_cast<C*>(L.v_cache);
            rope_store_rows(qkv.data(), positions, cos, sin, slots, k_cache, v_cache,
                            q.data(), (float*)nullptr, n, heads, kv_heads, hd, num_blocks, bs);
            paged_attention_rows(q.data(), (const C*)k_cache, (const C*)v_cache, tables, seqs,
                                 lens, a.data(), n, heads, kv_heads, hd, num_blocks, bs,
                                 max_blocks, max_len, scale, splits, scratch.data(),
                                 parts.get());
            project(L.o, L.o_scales, a.data(), h, h, n, hidden, heads * hd, xq.data(), xs.data());
            rms_norm_rows(h, L.post_norm, x.data(), n, hidden, eps);
            project(L.gate_up, L.gate_up_scales, x.data(), nullptr, gate_up.data(), n,
                    2 * inter, hidden, xq.data(), xs.data());
            silu_mul_rows(gate_up.data(), act.data(), n, inter);
            project(L.down, L.down_scales, act.data(), h, h, n, hidden, inter, xq.data(),
                    xs.data());
        }
    }
}

#define STACK_EXPORT(NAME, C)                                                                  \
    extern "C" void NAME(const int64_t* layer_addresses, int64_t num_layers, float* h,         \
                         int64_t n, int64_t hidden, int64_t heads, int64_t kv_heads,           \
                         int64_t hd, int64_t inter, float eps, const int64_t* positions,       \
                         const float* cos, const float* sin, const int64_t* slots,             \
                         const int64_t* tables, const int64_t* seqs, const int64_t* lens,      \
                         int64_t num_blocks, int64_t bs, int64_t max_blocks, int64_t max_len,  \
                         float scale, int threads) {                                           \
        decode_stack<C>(layer_addresses, num_layers, h, n, hidden, heads, kv_heads, hd, inter, \
                        eps, positions, cos, sin, slots, tables, seqs, lens, num_blocks, bs,   \
                        max_blocks, max_len, scale, threads);                                  \
    }

STACK_EXPORT(decode_stack_f32, float)
STACK_EXPORT(decode_stack_f32_bf16kv, bf16)
