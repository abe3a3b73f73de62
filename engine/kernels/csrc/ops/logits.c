/* The sampler's native help: a constrained-decoding token mask applied to the logits. */
#include "ops.h"

/* logits[i] = -inf where bit i of `allowed` is clear: a constrained-decoding token mask
 * in 32-bit little-endian words (llguidance's bitmask layout); tokens past the mask's
 * `n_mask` bits are not allowed either */
void gc_mask_logits(float *logits, int64_t n, const uint32_t *allowed, int64_t n_mask) {
    for (int64_t w = 0; w * 32 < n; w++) {
        const int64_t lo = w * 32, hi = lo + 32 < n ? lo + 32 : n;
        const uint32_t bits = lo < n_mask ? allowed[w] : 0u;
        if (bits == 0xFFFFFFFFu && hi <= n_mask) continue;
        for (int64_t i = lo; i < hi; i++)
            if (i >= n_mask || !((bits >> (i - lo)) & 1u)) logits[i] = -INFINITY;
    }
}
