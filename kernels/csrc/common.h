/* Helpers shared by the CPU kernels in this folder. */
#ifndef RADIXGEN_CSRC_COMMON_H
#define RADIXGEN_CSRC_COMMON_H

#include <stdint.h>
#include <string.h>

/* exp(x) for x <= 0 (scores minus their max, or -|g|) in a form the compiler vectorizes
 * without fast-math flags (only integer selects): 2^(x log2 e) split into an integer power k,
 * built in the exponent bits, and 2^f, |f| <= 1/2, by Cephes' exp2f polynomial. Relative error
 * ~1e-6 for x >= -20 (measured against double exp); results below 2^-126 flush to 0; NaN and
 * -inf give NaN (neither occurs in these kernels unless the model already overflowed). */
static inline float exp_nonpositive(float x) {
    const float t = x * 1.44269504088896341f;
    const int32_t k0 = (int32_t)(t - 0.5f); /* round to nearest for t <= 0 */
    const int32_t keep = -(int32_t)(k0 >= -126); /* all ones while 2^k is a normal float */
    const int32_t k = k0 >= -126 ? k0 : -126;
    const float f = t - (float)k;
    float p = 1.535336188319500e-4f;
    p = p * f + 1.339887440266574e-3f;
    p = p * f + 9.618437357674640e-3f;
    p = p * f + 5.550332471162809e-2f;
    p = p * f + 2.402264791363012e-1f;
    p = p * f + 6.931472028550421e-1f;
    p = p * f + 1.0f;
    const int32_t scale_bits = (k + 127) << 23;
    float scale, r;
    int32_t r_bits;
    memcpy(&scale, &scale_bits, sizeof scale);
    r = p * scale;
    memcpy(&r_bits, &r, sizeof r);
    r_bits &= keep;
    memcpy(&r, &r_bits, sizeof r);
    return r + (x - x); /* x - x is 0, or NaN for NaN/inf input */
}

#endif
