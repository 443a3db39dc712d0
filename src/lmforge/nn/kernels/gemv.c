/* Decoding's matrix-vector products on an x86 CPU with AVX2: a few activation rows times int8, bf16 or fp32 weights.
 * Decoding one sequence is bound by streaming the weights, so both read them in their narrow form and widen in
 * registers. Output rows are shared among the OpenMP threads of the calling process (torch's pool, once torch
 * is loaded). lmforge/nn/gemv.py builds this file and hands its functions to the operators of gemv_ops.cpp;
 * tests/test_gemv.py checks them against torch.
 *
 * int8 (lmforge_int8_gemv_n). Each row of x is rounded to int8 with one scale (symmetric, max |x| -> 127), as
 * llama.cpp rounds activations for its Q8_0 dot products; every dot product is then exact in int32 and scaled once:
 *
 *     y[r, o] = xs[r] * ws[o] * sum_i xq[r, i] * q[o, i]
 *
 * Several weights of one x (an attention's q, k and v) are done in one call, with x rounded once.
 *
 * AVX2 multiplies unsigned by signed bytes (maddubs), so |x| times q carrying x's sign stands for x times q.
 * Both stay within [-127, 127], so a pair of products fits int16 (2 * 127 * 127 = 32258) and nothing saturates.
 *
 * bf16 (lmforge_bf16_gemv). A bf16 number is the top half of an fp32 one, so shifting it left by 16 bits widens
 * it exactly; products are summed in fp32 and the output rounded to bf16 once (to nearest even), as a bf16
 * matmul that accumulates in fp32 does:
 *
 *     y[r, o] = bf16(b[o] + sum_i x[r, i] * w[o, i])
 *
 * fp32 (lmforge_f32_gemv). The same loop with nothing to widen: MKL's sgemm reads the weights well below the
 * bandwidth at one or two rows.
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Each weight stream is prefetched this many bytes ahead of its loads, once per cache line: the hardware
 * prefetcher alone left the streams short of the read bandwidth (lmforge/nn/gemv.py has the figures). A prefetch
 * never faults, so one past the last row is harmless. */
#define PREFETCH_AHEAD 1024
#define PREFETCH(p) _mm_prefetch((const char *)(p) + PREFETCH_AHEAD, _MM_HINT_T0)

/* acc += the products of 32 pairs (|a| times w carrying a's sign), summed in pairs and then in fours to int32. */
static inline __m256i dot_step(__m256i a_abs, __m256i a, const int8_t *w, __m256i acc) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i wv = _mm256_loadu_si256((const __m256i *)w);
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(a_abs, _mm256_sign_epi8(wv, a)), ones));
}

static int32_t dot_int8(const int8_t *a, const int8_t *w, int64_t n) {
    __m256i acc = _mm256_setzero_si256();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256i av = _mm256_loadu_si256((const __m256i *)(a + i));
        acc = dot_step(_mm256_sign_epi8(av, av), av, w + i, acc);
    }
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
    s = _mm_hadd_epi32(s, s);
    s = _mm_hadd_epi32(s, s);
    int32_t total = _mm_cvtsi128_si32(s);
    for (; i < n; i++) total += (int32_t)a[i] * (int32_t)w[i];
    return total;
}

/* out[k] = sum_i a[i] * w[k][i] for four weight rows at once: |a| and a's signs are loaded once for the four. */
static void dot_int8_x4(const int8_t *a, const int8_t *const w[4], int64_t n, int32_t out[4]) {
    __m256i c0 = _mm256_setzero_si256(), c1 = c0, c2 = c0, c3 = c0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256i av = _mm256_loadu_si256((const __m256i *)(a + i));
        __m256i a_abs = _mm256_sign_epi8(av, av);
        if ((i & 63) == 0)  /* once per cache line of each row */
            for (int k = 0; k < 4; k++) PREFETCH(w[k] + i);
        c0 = dot_step(a_abs, av, w[0] + i, c0);
        c1 = dot_step(a_abs, av, w[1] + i, c1);
        c2 = dot_step(a_abs, av, w[2] + i, c2);
        c3 = dot_step(a_abs, av, w[3] + i, c3);
    }
    __m256i s = _mm256_hadd_epi32(_mm256_hadd_epi32(c0, c1), _mm256_hadd_epi32(c2, c3));  /* per half: the 4 sums */
    _mm_storeu_si128((__m128i *)out, _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1)));
    for (; i < n; i++)
        for (int k = 0; k < 4; k++) out[k] += (int32_t)a[i] * (int32_t)w[k][i];
}

/* This thread's contiguous share [lo, hi) of n rows (empty for a thread beyond the rows). */
static void share(int64_t n, int thread, int threads, int64_t *lo, int64_t *hi) {
    int64_t per = (n + threads - 1) / threads;
    *lo = thread * per < n ? thread * per : n;
    *hi = *lo + per < n ? *lo + per : n;
}

/* This thread's share of y (m, n_out) = rounded x times q (n_out, n_in): a contiguous range of output rows, read as
 * four streams (one row from each quarter of the range at a time). Four streams read memory faster than one on the
 * machines measured (the module docstring of lmforge/nn/gemv.py: 1.45-1.9x at decoding's shapes). */
static void int8_rows(const int8_t *xq, const float *xs, const int8_t *q, const float *ws, float *y, int64_t m,
                      int64_t n_in, int64_t n_out, int thread, int threads) {
    int64_t lo, hi;
    share(n_out, thread, threads, &lo, &hi);
    int64_t quarter = (hi - lo) / 4;
    for (int64_t j = 0; j < quarter; j++) {
        int64_t o[4] = {lo + j, lo + j + quarter, lo + j + 2 * quarter, lo + j + 3 * quarter};
        const int8_t *w[4] = {q + o[0] * n_in, q + o[1] * n_in, q + o[2] * n_in, q + o[3] * n_in};
        for (int64_t r = 0; r < m; r++) {
            int32_t sums[4];
            dot_int8_x4(xq + r * n_in, w, n_in, sums);
            for (int k = 0; k < 4; k++) y[r * n_out + o[k]] = (float)sums[k] * xs[r] * ws[o[k]];
        }
    }
    for (int64_t o = lo + 4 * quarter; o < hi; o++)  /* the last (hi - lo) % 4 rows */
        for (int64_t r = 0; r < m; r++)
            y[r * n_out + o] = (float)dot_int8(xq + r * n_in, q + o * n_in, n_in) * xs[r] * ws[o];
}

/* Row x (n) -> xq = round(x / scale) as int8, half to even as torch.round does; returns scale = max|x| / 127, or
 * NaN when x holds a NaN or an infinity (all outputs then NaN, as a float matmul would give). */
static float round_row(const float *x, int8_t *xq, int64_t n) {
    /* |x| as bits: for non-negative floats the integer order is the float order, and an infinity or NaN is
     * every bit pattern from 0x7f800000 up, so one unsigned max gives both max|x| and whether all are finite. */
    const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
    __m256i vmax = _mm256_setzero_si256();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        vmax = _mm256_max_epu32(vmax, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(x + i)), abs_mask));
    uint32_t lanes[8], top = 0;
    _mm256_storeu_si256((__m256i *)lanes, vmax);
    for (int k = 0; k < 8; k++) top = lanes[k] > top ? lanes[k] : top;
    for (; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, x + i, 4);
        bits &= 0x7fffffff;
        top = bits > top ? bits : top;
    }
    int finite = top < 0x7f800000u;
    float amax;
    memcpy(&amax, &top, 4);
    float scale = amax / 127.0f;
    if (!finite || !(scale > 0.0f)) {
        memset(xq, 0, (size_t)n);
        return finite ? scale : NAN;
    }
    const __m256 vs = _mm256_set1_ps(scale);
    for (i = 0; i + 8 <= n; i += 8) {
        __m256 q = _mm256_round_ps(_mm256_div_ps(_mm256_loadu_ps(x + i), vs), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m256i v = _mm256_cvtps_epi32(q);
        __m128i w16 = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
        _mm_storel_epi64((__m128i *)(xq + i), _mm_packs_epi16(w16, w16));
    }
    for (; i < n; i++) xq[i] = (int8_t)nearbyintf(x[i] / scale);
    return scale;
}

/* For k < n: x (m, n_in) fp32, q[k] (n_out[k], n_in) int8, ws[k] (n_out[k]) fp32 -> y[k] (m, n_out[k]) fp32: several
 * weights of one input (an attention's q, k and v) with x rounded once and one pass of the threads, which take their
 * share of each weight's rows in turn without waiting for each other. Returns 0, or 1 when out of memory (nothing
 * written). */
int lmforge_int8_gemv_n(const float *x, int64_t m, int64_t n_in, int64_t n, const int8_t *const *q,
                        const float *const *ws, float *const *y, const int64_t *n_out) {
    if (m <= 0) return 0;
    if (n_in <= 0) {  /* empty sums */
        for (int64_t k = 0; k < n; k++)
            for (int64_t i = 0; i < m * n_out[k]; i++) y[k][i] = 0.0f;
        return 0;
    }
    int8_t *xq = malloc((size_t)(m * n_in));
    float *xs = malloc((size_t)m * sizeof(float));
    if (!xq || !xs) {
        free(xq);
        free(xs);
        return 1;
    }
    for (int64_t r = 0; r < m; r++)
        xs[r] = round_row(x + r * n_in, xq + r * n_in, n_in);
#pragma omp parallel
    {
        int thread = omp_get_thread_num(), threads = omp_get_num_threads();
        for (int64_t k = 0; k < n; k++)  /* no barrier between weights: each thread goes on to its next share */
            int8_rows(xq, xs, q[k], ws[k], y[k], m, n_in, n_out[k], thread, threads);
    }
    free(xq);
    free(xs);
    return 0;
}

static float bf16_to_float(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint16_t float_to_bf16(float f) {  /* round to nearest even; a NaN stays a (quiet) NaN */
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* 16 bf16 weights per 32-byte load: as 8 uint32 lanes, lane k holds weight 2k in its low half and 2k+1 in its
 * high half, so a shift widens the even weights and a mask the odd ones. The activations are laid out to match
 * once per call (deinterleave): per block of 16, the 8 even positions, then the 8 odd ones. */
static void deinterleave(const uint16_t *x, float *xp, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int k = 0; k < 8; k++) {
            xp[i + k] = bf16_to_float(x[i + 2 * k]);
            xp[i + 8 + k] = bf16_to_float(x[i + 2 * k + 1]);
        }
    for (; i < n; i++) xp[i] = bf16_to_float(x[i]);
}

static float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_hadd_ps(s, s);
    s = _mm_hadd_ps(s, s);
    return _mm_cvtss_f32(s);
}

#define OUT_BLOCK 4 /* weight rows per pass: independent sums (FMA latency) and memory streams */

/* out[j * 2 + r] = sum_i xp[r][i] * w[j][i] for weight rows j < nb (w + j * ws) and activation rows r < nr (1 or 2),
 * with xp deinterleaved: each weight is widened once, each activation load serves nb rows. Called with constant
 * nb and nr, so the compiler keeps the sums in registers. */
static inline __attribute__((always_inline)) void dot_bf16(const float *xp, int64_t stride, int nr, const uint16_t *w,
                                                           int64_t ws, int nb, int64_t n, float *out) {
    const __m256i high = _mm256_set1_epi32((int)0xffff0000u);
    __m256 acc[OUT_BLOCK][2];
    for (int j = 0; j < nb; j++) acc[j][0] = acc[j][1] = _mm256_setzero_ps();
    const float *x0 = xp, *x1 = xp + (nr > 1 ? stride : 0);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 xe0 = _mm256_loadu_ps(x0 + i), xo0 = _mm256_loadu_ps(x0 + i + 8);
        __m256 xe1 = _mm256_loadu_ps(x1 + i), xo1 = _mm256_loadu_ps(x1 + i + 8);
        for (int j = 0; j < nb; j++) {
            if ((i & 31) == 0) PREFETCH(w + j * ws + i);  /* 32 bf16: a cache line */
            __m256i pair = _mm256_loadu_si256((const __m256i *)(w + j * ws + i));
            __m256 even = _mm256_castsi256_ps(_mm256_slli_epi32(pair, 16));
            __m256 odd = _mm256_castsi256_ps(_mm256_and_si256(pair, high));
            acc[j][0] = _mm256_fmadd_ps(odd, xo0, _mm256_fmadd_ps(even, xe0, acc[j][0]));
            if (nr > 1) acc[j][1] = _mm256_fmadd_ps(odd, xo1, _mm256_fmadd_ps(even, xe1, acc[j][1]));
        }
    }
    for (int j = 0; j < nb; j++)
        for (int r = 0; r < nr; r++) {
            const float *xr = r ? x1 : x0;
            float total = hsum(acc[j][r]);
            for (int64_t k = i; k < n; k++) total += xr[k] * bf16_to_float(w[j * ws + k]);
            out[j * 2 + r] = total;
        }
}

/* fp32: out[j * 2 + r] = sum_i x[r][i] * w[j][i], as dot_bf16 with nothing to widen. */
static inline __attribute__((always_inline)) void dot_f32(const float *x, int64_t stride, int nr, const float *w,
                                                          int64_t ws, int nb, int64_t n, float *out) {
    __m256 acc[OUT_BLOCK][2];
    for (int j = 0; j < nb; j++) acc[j][0] = acc[j][1] = _mm256_setzero_ps();
    const float *x0 = x, *x1 = x + (nr > 1 ? stride : 0);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 a = _mm256_loadu_ps(x0 + i), c = _mm256_loadu_ps(x1 + i);
        for (int j = 0; j < nb; j++) {
            if ((i & 15) == 0) PREFETCH(w + j * ws + i);  /* 16 floats: a cache line */
            __m256 wj = _mm256_loadu_ps(w + j * ws + i);
            acc[j][0] = _mm256_fmadd_ps(wj, a, acc[j][0]);
            if (nr > 1) acc[j][1] = _mm256_fmadd_ps(wj, c, acc[j][1]);
        }
    }
    for (int j = 0; j < nb; j++)
        for (int r = 0; r < nr; r++) {
            const float *xr = r ? x1 : x0;
            float total = hsum(acc[j][r]);
            for (int64_t k = i; k < n; k++) total += xr[k] * w[j * ws + k];
            out[j * 2 + r] = total;
        }
}

/* The rows of y = x @ w^T + b for bf16 (widened) or fp32 weights: each thread takes a contiguous range of output
 * rows and reads it as OUT_BLOCK streams, one row from each part of its range per pass (as int8_rows does), then the
 * range's last few rows one at a time; activation rows in pairs. Inlined with a constant `bf16` and called with
 * constant counts, so each dot product is compiled for its case. x is fp32 (bf16 activations deinterleaved first);
 * y and b are in the weights' dtype. */
static inline __attribute__((always_inline)) void gemv_rows(int bf16, const float *x, const void *w, const void *b,
                                                            void *y, int64_t m, int64_t n_in, int64_t n_out) {
#pragma omp parallel
    {
        int thread = omp_get_thread_num(), threads = omp_get_num_threads();
        int64_t lo, hi;
        share(n_out, thread, threads, &lo, &hi);
        int64_t part = (hi - lo) / OUT_BLOCK, passes = part + (hi - lo) % OUT_BLOCK;
        for (int64_t p = 0; p < passes; p++) {
            /* rows o, o + step, ..., nb of them: a block across the parts, or one of the last rows */
            int64_t o = p < part ? lo + p : lo + OUT_BLOCK * part + (p - part), step = part;
            int nb = p < part ? OUT_BLOCK : 1;
            const uint16_t *wh = (const uint16_t *)w + o * n_in;
            const float *wf = (const float *)w + o * n_in;
            int64_t ws = step * n_in;
            float sums[OUT_BLOCK * 2];
            for (int64_t r = 0; r < m; r += 2) {
                int nr = m - r > 1 ? 2 : 1;
                const float *xr = x + r * n_in;
#define DOT(NR, NB) (bf16 ? dot_bf16(xr, n_in, NR, wh, ws, NB, n_in, sums) \
                         : dot_f32(xr, n_in, NR, wf, ws, NB, n_in, sums))
                if (nb == OUT_BLOCK && nr == 2) DOT(2, OUT_BLOCK);
                else if (nb == OUT_BLOCK) DOT(1, OUT_BLOCK);
                else if (nr == 2) DOT(2, 1);
                else DOT(1, 1);
#undef DOT
                for (int j = 0; j < nb; j++)
                    for (int k = 0; k < nr; k++) {
                        int64_t row = o + j * step, at = (r + k) * n_out + row;
                        if (bf16) {
                            float bias = b ? bf16_to_float(((const uint16_t *)b)[row]) : 0.0f;
                            ((uint16_t *)y)[at] = float_to_bf16(bias + sums[j * 2 + k]);
                        } else {
                            ((float *)y)[at] = (b ? ((const float *)b)[row] : 0.0f) + sums[j * 2 + k];
                        }
                    }
            }
        }
    }
}

/* x (m, n_in) bf16, w (n_out, n_in) bf16, b (n_out) bf16 or NULL -> y (m, n_out) bf16. Returns 0, or 1 when
 * out of memory (nothing written). */
int lmforge_bf16_gemv(const uint16_t *x, const uint16_t *w, const uint16_t *b, uint16_t *y, int64_t m,
                      int64_t n_in, int64_t n_out) {
    if (m <= 0 || n_out <= 0) return 0;
    float *xp = malloc((size_t)(m * (n_in > 0 ? n_in : 1)) * sizeof(float));
    if (!xp) return 1;
    for (int64_t r = 0; r < m; r++) deinterleave(x + r * n_in, xp + r * n_in, n_in);
    gemv_rows(1, xp, w, b, y, m, n_in, n_out);
    free(xp);
    return 0;
}

/* x (m, n_in) fp32, w (n_out, n_in) fp32, b (n_out) fp32 or NULL -> y (m, n_out) fp32. Returns 0. */
int lmforge_f32_gemv(const float *x, const float *w, const float *b, float *y, int64_t m, int64_t n_in,
                     int64_t n_out) {
    if (m > 0 && n_out > 0) gemv_rows(0, x, w, b, y, m, n_in, n_out);
    return 0;
}
