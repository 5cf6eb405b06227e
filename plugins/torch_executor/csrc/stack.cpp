// The decode stack (stack.h) of a small float32 step over compact weights: int8 with
// per-group scales, or bfloat16 (the layout linear_int8_rows and linear_bf16w_rows read).
#include "stack.h"

template <typename C>
static void decode_stack_compact(STACK_ARGS(float)) {
    const int64_t widest = std::max({hidden, heads * hd, inter});
    // The int8 projections' activations, quantised per row and group by every thread
    // together (quantize_rows), then read by all.
    std::vector<int16_t> xq(n * widest);
    std::vector<float> xs(n * (widest / QGROUP + 1));
    auto project = [&](const void* w, const float* scales, const float* x,
                       const float* residual, float* out, int64_t n_out, int64_t k) {
        if (scales != nullptr) {
            quantize_rows(x, n, k, xq.data(), xs.data());
            linear_int8_rows(static_cast<const int8_t*>(w), scales, xq.data(), xs.data(),
                             residual, out, n, n_out, k);
        } else {
            linear_bf16w_rows(static_cast<const bf16*>(w), x, residual, out, n, n_out, k);
        }
    };
    std::vector<float> gate_up(n * 2 * inter);
    auto project_gated = [&](const void* w, const float* scales, const float* x, float* act,
                             int64_t inter2, int64_t k) {
        project(w, scales, x, nullptr, gate_up.data(), inter2, k);
        silu_mul_rows(gate_up.data(), act, n, inter2 / 2);
    };
    auto no_runs = [](const float*, const C*, const C*, float*) {};  // the float32 stacks have none
    decode_layers<float, C>(STACK_ARG_NAMES, n, project, project_gated, no_runs);
}

extern "C" void decode_stack_f32(STACK_ARGS(float)) {
    decode_stack_compact<float>(STACK_ARG_NAMES);
}
// Over a bfloat16 KV cache (the float32 model with bfloat16 matmuls).
extern "C" void decode_stack_f32_bf16kv(STACK_ARGS(float)) {
    decode_stack_compact<bf16>(STACK_ARG_NAMES);
}
// Over a float16 KV cache (the float32 model with float32 matmuls, kv_cache_dtype).
extern "C" void decode_stack_f32_f16kv(STACK_ARGS(float)) {
    decode_stack_compact<f16>(STACK_ARG_NAMES);
}
