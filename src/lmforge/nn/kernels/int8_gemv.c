/* int8 weights times a few fp32 activation rows: decoding's matrix-vector products on an x86 CPU with AVX2.
 *
 * Each row of x is rounded to int8 with one scale (symmetric, max |x| -> 127), as llama.cpp rounds activations
 * for its Q8_0 dot products; every dot product is then exact in int32 and scaled once:
 *
 *     y[r, o] = xs[r] * ws[o] * sum_i xq[r, i] * q[o, i]
 *
 * AVX2 multiplies unsigned by signed bytes (maddubs), so |x| times q carrying x's sign stands for x times q.
 * Both stay within [-127, 127], so a pair of products fits int16 (2 * 127 * 127 = 32258) and nothing saturates.
 * Output rows are shared among the OpenMP threads of the calling process (torch's pool, once torch is loaded).
 * lmforge/nn/int8_gemv.py builds and calls this file; tests/test_int8_gemv.py checks it against torch.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

static int32_t dot_int8(const int8_t *a, const int8_t *w, int64_t n) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i acc = _mm256_setzero_si256();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256i av = _mm256_loadu_si256((const __m256i *)(a + i));
        __m256i wv = _mm256_loadu_si256((const __m256i *)(w + i));
        __m256i pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(av, av), _mm256_sign_epi8(wv, av));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, ones));
    }
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
    s = _mm_hadd_epi32(s, s);
    s = _mm_hadd_epi32(s, s);
    int32_t total = _mm_cvtsi128_si32(s);
    for (; i < n; i++) total += (int32_t)a[i] * (int32_t)w[i];
    return total;
}

/* x (m, n_in) fp32, q (n_out, n_in) int8, ws (n_out) fp32 -> y (m, n_out) fp32. Returns 0, or 1 when out of
 * memory (nothing written). */
int lmforge_int8_gemv(const float *x, const int8_t *q, const float *ws, float *y, int64_t m, int64_t n_in,
                      int64_t n_out) {
    if (m <= 0 || n_out <= 0) return 0;
    if (n_in <= 0) {  /* an empty sum */
        for (int64_t i = 0; i < m * n_out; i++) y[i] = 0.0f;
        return 0;
    }
    int8_t *xq = malloc((size_t)(m * n_in));
    float *xs = malloc((size_t)m * sizeof(float));
    if (!xq || !xs) {
        free(xq);
        free(xs);
        return 1;
    }
    for (int64_t r = 0; r < m; r++) {
        const float *xr = x + r * n_in;
        float amax = 0.0f;
        int finite = 1;
        for (int64_t i = 0; i < n_in; i++) {
            finite &= isfinite(xr[i]);
            amax = fmaxf(amax, fabsf(xr[i]));
        }
        float scale = amax / 127.0f;
        xs[r] = finite ? scale : NAN;  /* a NaN or infinite input gives NaN outputs, as a float matmul would */
        for (int64_t i = 0; i < n_in; i++)  /* x / scale, rounded half to even as torch.round does */
            xq[r * n_in + i] = finite && scale > 0.0f ? (int8_t)nearbyintf(xr[i] / scale) : 0;
    }
#pragma omp parallel for schedule(static)
    for (int64_t o = 0; o < n_out; o++) {
        const int8_t *w = q + o * n_in;
        for (int64_t r = 0; r < m; r++) y[r * n_out + o] = (float)dot_int8(xq + r * n_in, w, n_in) * xs[r] * ws[o];
    }
    free(xq);
    free(xs);
    return 0;
}
