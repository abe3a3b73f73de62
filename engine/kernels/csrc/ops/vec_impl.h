/* The vector loops of the dense ops, written once on simd.h's names: ops/vec.c includes
 * this once per ISA, with SIMD set to that ISA's prefix (avx512, avx2, neon), and gets
 * dot_avx2, act_mul_neon, ... The portable versions and the tails are ops/vec.c's
 * (the *_s functions). No include guard: it is meant to be included more than once. */

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define VT CAT(SIMD, _f32)
#define W CAT(SIMD, _W)
#define V(op) CAT(SIMD, CAT(_, op))
#define FN(name) CAT(name, CAT(_, SIMD))
/* an ISA's table may take some of its functions from another (see vec.c) */
#define DEF CAT(SIMD, _TARGET) __attribute__((unused)) static

DEF float FN(dot)(const float *a, const float *b, int n) {
    VT s0 = V(zero)(), s1 = V(zero)();
    int i = 0;
    for (; i + 2 * W <= n; i += 2 * W) {
        s0 = V(fma)(V(load)(a + i), V(load)(b + i), s0);
        s1 = V(fma)(V(load)(a + i + W), V(load)(b + i + W), s1);
    }
    for (; i + W <= n; i += W) s0 = V(fma)(V(load)(a + i), V(load)(b + i), s0);
    float s = V(reduce)(V(add)(s0, s1));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* out[q] = a . x[q] for k (1 to 4) rows, each summed in one chain: the same bits for any k */
#define DOT_ROWS_LOOP(K)                                                                                                \
    for (; i + W <= n; i += W) {                                                                                        \
        const VT va = V(load)(a + i);                                                                                   \
        for (int q = 0; q < (K); q++) s[q] = V(fma)(va, V(load)(x[q] + i), s[q]);                                      \
    }
DEF void FN(dot_rows)(const float *a, const float *const *x, int k, int n, float *out) {
    VT s[4] = {V(zero)(), V(zero)(), V(zero)(), V(zero)()};
    int i = 0;
    if (k == 4) DOT_ROWS_LOOP(4)
    else if (k == 3) DOT_ROWS_LOOP(3)
    else if (k == 2) DOT_ROWS_LOOP(2)
    else DOT_ROWS_LOOP(1)
    for (int q = 0; q < k; q++) {
        float r = V(reduce)(s[q]);
        for (int t = i; t < n; t++) r += a[t] * x[q][t];
        out[q] = r;
    }
}
#undef DOT_ROWS_LOOP

DEF void FN(axpy)(float a, const float *x, float *y, int n) {
    const VT va = V(set1)(a);
    int i = 0;
    for (; i + W <= n; i += W) V(store)(y + i, V(fma)(va, V(load)(x + i), V(load)(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

DEF void FN(axpy_v)(const float *a, const float *x, float *y, int n) {
    int i = 0;
    for (; i + W <= n; i += W) V(store)(y + i, V(fma)(V(load)(a + i), V(load)(x + i), V(load)(y + i)));
    for (; i < n; i++) y[i] += a[i] * x[i];
}

/* e^x to ~1 ulp: x = n ln2 + r, |r| <= ln2 / 2, e^r by a degree-7 polynomial (Cephes'
 * expf coefficients), 2^n through the exponent bits; x is clamped to [-87.3, 88.37] */
DEF VT FN(exp)(VT x) {
    x = V(min)(V(max)(x, V(set1)(-87.3f)), V(set1)(88.3762626647949f));
    const VT n = V(round)(V(mul)(x, V(set1)(1.44269504088896341f)));
    VT r = V(fnma)(n, V(set1)(0.693359375f), x);
    r = V(fnma)(n, V(set1)(-2.12194440e-4f), r);
    VT p = V(set1)(1.9875691500e-4f);
    p = V(fma)(p, r, V(set1)(1.3981999507e-3f));
    p = V(fma)(p, r, V(set1)(8.3334519073e-3f));
    p = V(fma)(p, r, V(set1)(4.1665795894e-2f));
    p = V(fma)(p, r, V(set1)(1.6666665459e-1f));
    p = V(fma)(p, r, V(set1)(5.0000001201e-1f));
    p = V(fma)(p, V(mul)(r, r), V(add)(r, V(set1)(1.f)));
    return V(mul)(p, V(pow2i)(n));
}

DEF void FN(act_mul)(const float *g, const float *u, float *out, int n, int act) {
    const VT one = V(set1)(1.f), half = V(set1)(0.5f), two = V(set1)(2.f);
    int i = 0;
    for (; i + W <= n; i += W) {
        const VT x = V(load)(g + i);
        VT a;
        if (act == ACT_SILU) {
            a = V(div)(x, V(add)(one, FN(exp)(V(sub)(V(zero)(), x))));
        } else if (act == ACT_SWIGLU_OAI) {
            const VT lim = V(set1)(OAI_LIMIT), xc = V(min)(x, lim);
            const VT y = V(max)(V(min)(V(load)(u + i), lim), V(sub)(V(zero)(), lim));
            a = V(div)(xc, V(add)(one, FN(exp)(V(mul)(V(set1)(-OAI_ALPHA), xc))));
            V(store)(out + i, V(mul)(a, V(add)(y, one)));
            continue;
        } else { /* 0.5 x (1 + tanh(z)), tanh(z) = 1 - 2 / (e^2z + 1) */
            const VT x3 = V(mul)(V(mul)(x, x), x);
            const VT z = V(mul)(V(set1)(0.7978845608028654f), V(fma)(V(set1)(0.044715f), x3, x));
            const VT t = V(sub)(one, V(div)(two, V(add)(FN(exp)(V(mul)(two, z)), one)));
            a = V(mul)(V(mul)(half, x), V(add)(one, t));
        }
        V(store)(out + i, V(mul)(a, V(load)(u + i)));
    }
    act_mul_s(g + i, u + i, out + i, n - i, act);
}

/* the tail too as a vector (padded with -inf: zeros), so that a score's exponential and
 * the lane it is summed in depend on its index only, not on how many follow it (a draft's
 * block of cells reaches further than the same token's block decoded alone) */
DEF float FN(exp_sum)(float *s, int n, float m) {
    const VT vm = V(set1)(m), ninf = V(set1)(-INFINITY);
    VT acc = V(zero)();
    for (int i = 0; i < n; i += W) {
        float pad[W];
        const int k = n - i < W ? n - i : W;
        float *p = s + i;
        if (k < W) {
            for (int j = 0; j < W; j++) pad[j] = j < k ? p[j] : -INFINITY;
            p = pad;
        }
        const VT x = V(load)(p);
        const VT e = V(zero_if_eq)(x, ninf, FN(exp)(V(sub)(x, vm)));
        V(store)(p, e);
        if (k < W) memcpy(s + i, pad, sizeof(float) * (size_t)k);
        acc = V(add)(acc, e);
    }
    return V(reduce)(acc);
}

DEF void FN(kv_load)(int type, const uint8_t *src, float *y, int d) {
    int i = 0;
    switch (type) {
    case KV_F16:
        for (; i + W <= d; i += W) V(store)(y + i, V(load_f16)(src + 2 * i));
        break;
    case KV_BF16:
        for (; i + W <= d; i += W) V(store)(y + i, V(load_bf16)(src + 2 * i));
        break;
    case KV_Q8_0:
        for (int b = 0; b < d / 32; b++) {
            const blk_q8_0 *blk = (const blk_q8_0 *)src + b;
            const VT s = V(set1)(V(half)(blk->d));
            for (int j = 0; j < 32; j += W) V(store)(y + 32 * b + j, V(mul)(s, V(load_i8)(blk->qs + j)));
        }
        return;
    case KV_Q4_0:
        for (int b = 0; b < d / 32; b++) {
            const blk_q4_0 *blk = (const blk_q4_0 *)src + b;
            const VT s = V(set1)(V(half)(blk->d));
            for (int j = 0; j < 16; j += W) {
                V(store)(y + 32 * b + j, V(mul)(s, V(load_q4)(blk->qs + j, 0)));
                V(store)(y + 32 * b + 16 + j, V(mul)(s, V(load_q4)(blk->qs + j, 1)));
            }
        }
        return;
    }
    if (i < d) kv_load_s(type, src + (type == KV_F32 ? 4 : 2) * i, y + i, d - i);
}

/* Gated DeltaNet's step (delta_step_s), 64 columns at a time held in registers: S^T k
 * over the rows, then each row updated and accumulated into o while it is in L1 (dv a
 * multiple of 64) */
DEF void FN(delta_step)(float *S, const float *qn, const float *kn, const float *v, float decay, float beta, float *o,
                        int dk, int dv) {
    enum { NV = 64 / W };
    const VT vdec = V(set1)(decay), vbeta = V(set1)(beta);
    for (int j0 = 0; j0 < dv; j0 += 64) {
        VT acc[NV], dl[NV];
        for (int l = 0; l < NV; l++) acc[l] = V(zero)();
        for (int i = 0; i < dk; i++) {
            const float *row = S + (int64_t)i * dv + j0;
            const VT ki = V(set1)(kn[i]);
            for (int l = 0; l < NV; l++) acc[l] = V(fma)(ki, V(load)(row + W * l), acc[l]);
        }
        for (int l = 0; l < NV; l++) dl[l] = V(mul)(V(fnma)(vdec, acc[l], V(load)(v + j0 + W * l)), vbeta);
        for (int l = 0; l < NV; l++) acc[l] = V(zero)();
        for (int i = 0; i < dk; i++) {
            float *row = S + (int64_t)i * dv + j0;
            const VT ki = V(set1)(kn[i]), qi = V(set1)(qn[i]);
            for (int l = 0; l < NV; l++) {
                const VT sv = V(fma)(V(load)(row + W * l), vdec, V(mul)(ki, dl[l]));
                V(store)(row + W * l, sv);
                acc[l] = V(fma)(qi, sv, acc[l]);
            }
        }
        for (int l = 0; l < NV; l++) V(store)(o + j0 + W * l, acc[l]);
    }
}

/* the attention tiles' two small matrix products (attention_tiles.c), built for this ISA */
DEF void FN(at_scores)(const float *Q, const float *Kt, float *S, int64_t R, int64_t d) { at_scores_s(Q, Kt, S, R, d); }

DEF void FN(at_pv)(const float *P, const float *Vr, int64_t v_stride, float *O, int64_t R, int64_t nc, int64_t d) {
    at_pv_s(P, Vr, v_stride, O, R, nc, d);
}

#undef CAT_
#undef CAT
#undef VT
#undef W
#undef V
#undef FN
#undef DEF
