// The CPU kernels one op at a time (ops.h has their bodies): each call opens its own
// parallel region, where the op is big enough to share.
#include "ops.h"

extern "C" const char* kernels_isa() { return VEC_ISA; }

template <typename T, typename O = T>
static void rms_norm(const T* x, const T* w, O* out, int64_t rows, int64_t dim, float eps,
                     int threads) {
    #pragma omp parallel num_threads(threads) if (rows >= 16)
    rms_norm_rows(x, w, out, rows, dim, eps);
}

// The float32 model's RMSNorm feeding a bfloat16 matmul: the output stored in bfloat16.
extern "C" void rms_norm_f32_bf16(const float* x, const float* w, bf16* out, int64_t rows,
                                  int64_t dim, float eps, int threads) {
    rms_norm<float, bf16>(x, w, out, rows, dim, eps, threads);
}

template <typename T>
static void silu_mul(const T* x, T* out, int64_t rows, int64_t inter, int threads) {
    #pragma omp parallel num_threads(threads) if (rows >= 8)
    silu_mul_rows(x, out, rows, inter);
}

template <typename T, typename C = T>
static void rope_store(const T* qkv, const int64_t* positions, const T* cos, const T* sin,
                       const int64_t* slots, C* k, C* v, T* q_out, T* k_out, int64_t n,
                       int64_t heads, int64_t kv_heads, int64_t hd, int64_t num_blocks,
                       int64_t bs, int threads) {
    #pragma omp parallel num_threads(threads) if (n >= 16)
    rope_store_rows(qkv, positions, cos, sin, slots, k, v, q_out, k_out, n, heads, kv_heads,
                    hd, num_blocks, bs);
}

template <typename T, typename C = T>
static void paged_attention(const T* q, const C* k, const C* v, const int64_t* tables,
                            const int64_t* seqs, const int64_t* lens, T* out, int64_t n,
                            int64_t heads, int64_t kv_heads, int64_t hd, int64_t num_blocks,
                            int64_t bs, int64_t max_blocks, int64_t max_len, float scale,
                            int threads) {
    const int64_t group = heads / kv_heads;
    const int64_t splits =
        attention_splits(max_len, bs, part_kernel<T, C>(bs, hd, group) != nullptr);
    // Every part writes its own slots before the merge reads them: no need to zero.
    std::unique_ptr<float[]> parts(new float[attention_parts_size(n, heads, hd, splits)]);
    #pragma omp parallel num_threads(threads)
    {
        std::vector<float> scratch(attention_scratch(group, hd, max_len, bs));
        paged_attention_rows(q, k, v, tables, seqs, lens, out, n, heads, kv_heads, hd,
                             num_blocks, bs, max_blocks, max_len, scale, splits,
                             scratch.data(), parts.get());
    }
}

extern "C" void linear_int8_f32(const int8_t* w, const float* scales, const float* x,
                                const float* residual, float* out, int64_t rows, int64_t n,
                                int64_t k, int threads) {
    // Quantised once per call, by the calling thread.
    thread_local std::vector<int16_t> xq;
    thread_local std::vector<float> xs;
    xq.resize(rows * k);
    xs.resize(rows * (k / QGROUP));
    quantize_rows(x, rows, k, xq.data(), xs.data());
    const int16_t* q = xq.data();
    const float* s = xs.data();
    #pragma omp parallel num_threads(threads)
    linear_int8_rows(w, scales, q, s, residual, out, rows, n, k);
}

extern "C" void linear_bf16w_f32(const bf16* w, const float* x, const float* residual,
                                 float* out, int64_t rows, int64_t n, int64_t k, int threads) {
    #pragma omp parallel num_threads(threads)
    linear_bf16w_rows(w, x, residual, out, rows, n, k);
}

extern "C" int64_t linear_int8_group() { return QGROUP; }

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

EXPORT(f32, float)
EXPORT(bf16, bf16)

// The float32 model over a 16-bit KV cache (bfloat16 or float16): K and V rounded as
// they are stored, attention computed in float32 from them.
#define EXPORT_KV(NAME, C)                                                                     \
    extern "C" void rope_store_f32_##NAME(const float* qkv, const int64_t* positions,          \
                                          const float* cos, const float* sin,                  \
                                          const int64_t* slots, C* k, C* v, float* q_out,      \
                                          float* k_out, int64_t n, int64_t heads,              \
                                          int64_t kv_heads, int64_t hd, int64_t num_blocks,    \
                                          int64_t bs, int threads) {                           \
        rope_store<float, C>(qkv, positions, cos, sin, slots, k, v, q_out, k_out, n, heads,    \
                             kv_heads, hd, num_blocks, bs, threads);                           \
    }                                                                                          \
    extern "C" void paged_attention_f32_##NAME(                                                \
        const float* q, const C* k, const C* v, const int64_t* tables, const int64_t* seqs,    \
        const int64_t* lens, float* out, int64_t n, int64_t heads, int64_t kv_heads,           \
        int64_t hd, int64_t num_blocks, int64_t bs, int64_t max_blocks, int64_t max_len,       \
        float scale, int threads) {                                                            \
        paged_attention<float, C>(q, k, v, tables, seqs, lens, out, n, heads, kv_heads, hd,    \
                                  num_blocks, bs, max_blocks, max_len, scale, threads);        \
    }

EXPORT_KV(bf16kv, bf16)
EXPORT_KV(f16kv, f16)

// Sampling by temperature alone (sample_row, ops.h): out[r] drawn from softmax(logits[r] *
// inv_temps[r]) by uniforms[r] in [0, 1); logits [rows, vocab] float32.
extern "C" void sample_rows_f32(const float* logits, const float* inv_temps,
                                const double* uniforms, int64_t* out, int64_t rows,
                                int64_t vocab, int threads) {
    #pragma omp parallel for num_threads(threads) schedule(static) if (rows >= 4)
    for (int64_t r = 0; r < rows; ++r)
        out[r] = sample_row(logits + r * vocab, vocab, inv_temps[r], uniforms[r]);
}
