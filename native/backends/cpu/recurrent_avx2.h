/* AVX2 variants of gdn_head_step / gdn_head_fold (recurrent_step.h), same signatures; S % 8 == 0. */
#ifndef SPECLA_RECURRENT_AVX2_H
#define SPECLA_RECURRENT_AVX2_H

void gdn_head_step_avx2(float *M, int S, const float *q, const float *k, const float *v, float decay, float beta,
                        float scale, float *out, float *delta_out);
void gdn_head_fold_avx2(float *M, int S, const float *k, const float *delta, float decay);

#endif
