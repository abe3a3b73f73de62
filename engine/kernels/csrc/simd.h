/* The float32 vector of each ISA behind one set of names, so that one op body serves
 * every ISA (as ggml-cpu's simd-mappings.h): for ISA in avx512, avx2, neon, the type
 * ISA_f32, its width ISA_W, ISA_TARGET (the function attribute that lets the compiler
 * use it) and ISA_op(...) for the ops below. ops/vec_impl.h writes the ops' bodies
 * once on these names; ops/vec.c builds them once per ISA of this architecture, beside
 * the portable C, and picks one at run time. Every op is exact or rounds as the one
 * instruction it names (fma: one rounding), so the ISAs differ only in their width. */
#ifndef GC_SIMD_H
#define GC_SIMD_H

#include "gc.h"

/*   zero()            all lanes 0          set1(a)          all lanes a
 *   load(p) store(p,v) W floats, unaligned  add sub mul div min max
 *   fma(a, b, c)      a b + c              fnma(a, b, c)    c - a b
 *   round(v)          to nearest integer   pow2i(n)         2^n for integral n in [-126, 127]
 *   zero_if_eq(x, y, v) v where x != y, 0 where x == y
 *   reduce(v)         the lanes' sum (in the order of the ISA's usual halving)
 *   half(h)           one float16 bits as a float
 *   load_f16(p) load_bf16(p) load_i8(p) W float16 / bfloat16 / int8 values as floats
 *   load_q4(p, hi)    W values (p[i] >> 4 hi & 15) - 8 as floats (Q4_0's nibbles) */

#if defined(GC_X86)

#define avx512_W 16
#define avx512_TARGET __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl")))
typedef __m512 avx512_f32;
avx512_TARGET static inline __m512 avx512_zero(void) { return _mm512_setzero_ps(); }
avx512_TARGET static inline __m512 avx512_set1(float a) { return _mm512_set1_ps(a); }
avx512_TARGET static inline __m512 avx512_load(const float *p) { return _mm512_loadu_ps(p); }
avx512_TARGET static inline void avx512_store(float *p, __m512 v) { _mm512_storeu_ps(p, v); }
avx512_TARGET static inline __m512 avx512_add(__m512 a, __m512 b) { return _mm512_add_ps(a, b); }
avx512_TARGET static inline __m512 avx512_sub(__m512 a, __m512 b) { return _mm512_sub_ps(a, b); }
avx512_TARGET static inline __m512 avx512_mul(__m512 a, __m512 b) { return _mm512_mul_ps(a, b); }
avx512_TARGET static inline __m512 avx512_div(__m512 a, __m512 b) { return _mm512_div_ps(a, b); }
avx512_TARGET static inline __m512 avx512_min(__m512 a, __m512 b) { return _mm512_min_ps(a, b); }
avx512_TARGET static inline __m512 avx512_max(__m512 a, __m512 b) { return _mm512_max_ps(a, b); }
avx512_TARGET static inline __m512 avx512_fma(__m512 a, __m512 b, __m512 c) { return _mm512_fmadd_ps(a, b, c); }
avx512_TARGET static inline __m512 avx512_fnma(__m512 a, __m512 b, __m512 c) { return _mm512_fnmadd_ps(a, b, c); }
avx512_TARGET static inline __m512 avx512_round(__m512 v) {
    return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
avx512_TARGET static inline __m512 avx512_pow2i(__m512 n) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
}
avx512_TARGET static inline __m512 avx512_zero_if_eq(__m512 x, __m512 y, __m512 v) {
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, y, _CMP_NEQ_UQ), v);
}
avx512_TARGET static inline float avx512_reduce(__m512 v) { return _mm512_reduce_add_ps(v); }
avx512_TARGET static inline float avx512_half(uint16_t h) { return _cvtsh_ss(h); }
avx512_TARGET static inline __m512 avx512_load_f16(const void *p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}
avx512_TARGET static inline __m512 avx512_load_bf16(const void *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
avx512_TARGET static inline __m512 avx512_load_i8(const int8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}
avx512_TARGET static inline __m512 avx512_load_q4(const uint8_t *p, int hi) {
    const __m128i q = _mm_srli_epi16(_mm_loadu_si128((const __m128i *)p), 4 * hi);
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_sub_epi8(_mm_and_si128(q, _mm_set1_epi8(15)), _mm_set1_epi8(8))));
}

#define avx2_W 8
#define avx2_TARGET __attribute__((target("avx2,fma,f16c")))
typedef __m256 avx2_f32;
avx2_TARGET static inline __m256 avx2_zero(void) { return _mm256_setzero_ps(); }
avx2_TARGET static inline __m256 avx2_set1(float a) { return _mm256_set1_ps(a); }
avx2_TARGET static inline __m256 avx2_load(const float *p) { return _mm256_loadu_ps(p); }
avx2_TARGET static inline void avx2_store(float *p, __m256 v) { _mm256_storeu_ps(p, v); }
avx2_TARGET static inline __m256 avx2_add(__m256 a, __m256 b) { return _mm256_add_ps(a, b); }
avx2_TARGET static inline __m256 avx2_sub(__m256 a, __m256 b) { return _mm256_sub_ps(a, b); }
avx2_TARGET static inline __m256 avx2_mul(__m256 a, __m256 b) { return _mm256_mul_ps(a, b); }
avx2_TARGET static inline __m256 avx2_div(__m256 a, __m256 b) { return _mm256_div_ps(a, b); }
avx2_TARGET static inline __m256 avx2_min(__m256 a, __m256 b) { return _mm256_min_ps(a, b); }
avx2_TARGET static inline __m256 avx2_max(__m256 a, __m256 b) { return _mm256_max_ps(a, b); }
avx2_TARGET static inline __m256 avx2_fma(__m256 a, __m256 b, __m256 c) { return _mm256_fmadd_ps(a, b, c); }
avx2_TARGET static inline __m256 avx2_fnma(__m256 a, __m256 b, __m256 c) { return _mm256_fnmadd_ps(a, b, c); }
avx2_TARGET static inline __m256 avx2_round(__m256 v) {
    return _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
avx2_TARGET static inline __m256 avx2_pow2i(__m256 n) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
}
avx2_TARGET static inline __m256 avx2_zero_if_eq(__m256 x, __m256 y, __m256 v) {
    return _mm256_andnot_ps(_mm256_cmp_ps(x, y, _CMP_EQ_OQ), v);
}
avx2_TARGET static inline float avx2_reduce(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
avx2_TARGET static inline float avx2_half(uint16_t h) { return _cvtsh_ss(h); }
avx2_TARGET static inline __m256 avx2_load_f16(const void *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
avx2_TARGET static inline __m256 avx2_load_bf16(const void *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}
avx2_TARGET static inline __m256 avx2_load_i8(const int8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}
avx2_TARGET static inline __m256 avx2_load_q4(const uint8_t *p, int hi) {
    const __m128i q = _mm_srli_epi16(_mm_loadl_epi64((const __m128i *)p), 4 * hi);
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_sub_epi8(_mm_and_si128(q, _mm_set1_epi8(15)), _mm_set1_epi8(8))));
}

#elif defined(GC_NEON)

#define neon_W 4
#define neon_TARGET
typedef float32x4_t neon_f32;
static inline float32x4_t neon_zero(void) { return vdupq_n_f32(0.f); }
static inline float32x4_t neon_set1(float a) { return vdupq_n_f32(a); }
static inline float32x4_t neon_load(const float *p) { return vld1q_f32(p); }
static inline void neon_store(float *p, float32x4_t v) { vst1q_f32(p, v); }
static inline float32x4_t neon_add(float32x4_t a, float32x4_t b) { return vaddq_f32(a, b); }
static inline float32x4_t neon_sub(float32x4_t a, float32x4_t b) { return vsubq_f32(a, b); }
static inline float32x4_t neon_mul(float32x4_t a, float32x4_t b) { return vmulq_f32(a, b); }
static inline float32x4_t neon_div(float32x4_t a, float32x4_t b) { return vdivq_f32(a, b); }
static inline float32x4_t neon_min(float32x4_t a, float32x4_t b) { return vminq_f32(a, b); }
static inline float32x4_t neon_max(float32x4_t a, float32x4_t b) { return vmaxq_f32(a, b); }
static inline float32x4_t neon_fma(float32x4_t a, float32x4_t b, float32x4_t c) { return vfmaq_f32(c, a, b); }
static inline float32x4_t neon_fnma(float32x4_t a, float32x4_t b, float32x4_t c) { return vfmsq_f32(c, a, b); }
static inline float32x4_t neon_round(float32x4_t v) { return vrndnq_f32(v); }
static inline float32x4_t neon_pow2i(float32x4_t n) {
    return vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23));
}
static inline float32x4_t neon_zero_if_eq(float32x4_t x, float32x4_t y, float32x4_t v) {
    return vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(v), vceqq_f32(x, y)));
}
static inline float neon_reduce(float32x4_t v) { return vaddvq_f32(v); }
static inline float neon_half(uint16_t h) { return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0); }
static inline float32x4_t neon_load_f16(const void *p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }
static inline float32x4_t neon_load_bf16(const void *p) {
    return vreinterpretq_f32_u32(vshlq_n_u32(vmovl_u16(vld1_u16(p)), 16));
}
static inline int8x8_t neon_four_bytes(const void *p) {
    uint32_t b;
    memcpy(&b, p, 4);
    return vreinterpret_s8_u32(vdup_n_u32(b));
}
static inline float32x4_t neon_load_i8(const int8_t *p) {
    return vcvtq_f32_s32(vmovl_s16(vget_low_s16(vmovl_s8(neon_four_bytes(p)))));
}
static inline float32x4_t neon_load_q4(const uint8_t *p, int hi) {
    uint8x8_t q = vreinterpret_u8_s8(neon_four_bytes(p));
    q = vand_u8(hi ? vshr_n_u8(q, 4) : q, vdup_n_u8(15));
    const int8x8_t s = vsub_s8(vreinterpret_s8_u8(q), vdup_n_s8(8));
    return vcvtq_f32_s32(vmovl_s16(vget_low_s16(vmovl_s8(s))));
}

#endif

#endif
