// Double-precision references for the backend tests (see ref.h).
#include "ref.h"

#include <math.h>
#include <stdlib.h>

void ref_encoder_forward(float *out, const int32_t *tok, const float *wte, const float *wpe, int B,
                         int T, int C) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++)
                out[(b * T + t) * C + c] =
                    (float)((double)wte[tok[b * T + t] * C + c] + wpe[t * C + c]);
}

void ref_encoder_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tok, int B,
                          int T, int C) {
    // sum each output element in double over every (b,t) that reaches it
    for (int t = 0; t < T; t++)
        for (int c = 0; c < C; c++) {
            double s = dwpe[t * C + c];
            for (int b = 0; b < B; b++) s += dout[(b * T + t) * C + c];
            dwpe[t * C + c] = (float)s;
        }
    int n = B * T;
    char *done = calloc((size_t)n, 1);
    for (int i = 0; i < n; i++) {
        if (done[i]) continue;
        for (int c = 0; c < C; c++) {
            double s = dwte[tok[i] * C + c];
            for (int j = i; j < n; j++)
                if (tok[j] == tok[i]) s += dout[j * C + c];
            dwte[tok[i] * C + c] = (float)s;
        }
        for (int j = i; j < n; j++)
            if (tok[j] == tok[i]) done[j] = 1;
    }
    free(done);
}

static void ref_moments(const float *x, int C, double *mean, double *rstd) {
    double m = 0, v = 0;
    for (int c = 0; c < C; c++) m += x[c];
    m /= C;
    for (int c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
    *mean = m;
    *rstd = 1.0 / sqrt(v / C + 1e-5);
}

void ref_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w,
                           const float *b, int N, int C) {
    for (int n = 0; n < N; n++) {
        double m, r;
        ref_moments(inp + n * C, C, &m, &r);
        for (int c = 0; c < C; c++)
            out[n * C + c] = (float)((inp[n * C + c] - m) * r * w[c] + b[c]);
        mean[n] = (float)m;
        rstd[n] = (float)r;
    }
}

void ref_layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                            const float *w, int N, int C) {
    double *gw = calloc((size_t)C, sizeof(double)), *gb = calloc((size_t)C, sizeof(double));
    for (int n = 0; n < N; n++) {
        const float *x = inp + n * C, *dy = dout + n * C;
        double m, r, gmean = 0, gnmean = 0;
        ref_moments(x, C, &m, &r);
        for (int c = 0; c < C; c++) {
            gmean += (double)w[c] * dy[c] / C;
            gnmean += (double)w[c] * dy[c] * (x[c] - m) * r / C;
        }
        for (int c = 0; c < C; c++) {
            double nrm = (x[c] - m) * r;
            gw[c] += nrm * dy[c];
            gb[c] += dy[c];
            dinp[n * C + c] =
                (float)(dinp[n * C + c] + ((double)w[c] * dy[c] - gmean - nrm * gnmean) * r);
        }
    }
    for (int c = 0; c < C; c++) {
        dw[c] = (float)(dw[c] + gw[c]);
        db[c] = (float)(db[c] + gb[c]);
    }
    free(gw);
    free(gb);
}

void ref_matmul_forward(float *out, const float *inp, const float *w, const float *bias, int N,
                        int C, int OC) {
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double s = bias ? bias[o] : 0.0;
            for (int c = 0; c < C; c++) s += (double)inp[n * C + c] * w[o * C + c];
            out[n * OC + o] = (float)s;
        }
}

void ref_column_sums(float *dst, const float *x, int N, int n) {
    for (int c = 0; c < n; c++) {
        double s = dst[c];
        for (int r = 0; r < N; r++) s += x[(int64_t)r * n + c];
        dst[c] = (float)s;
    }
}

void ref_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                         const float *w, int N, int C, int OC) {
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) {
            double s = 0;
            for (int o = 0; o < OC; o++) s += (double)dout[n * OC + o] * w[o * C + c];
            dinp[n * C + c] = (float)s;
        }
    for (int o = 0; o < OC; o++) {
        for (int c = 0; c < C; c++) {
            double s = dw[o * C + c];
            for (int n = 0; n < N; n++) s += (double)dout[n * OC + o] * inp[n * C + c];
            dw[o * C + c] = (float)s;
        }
    }
    if (dbias) ref_column_sums(dbias, dout, N, OC);
}

// P (T,T) = causal softmax of q k^T / sqrt(hs) for head (b,h); returns lse per row in lse (T)
static void ref_attention_probs(double *P, double *lse, const float *qkv, int b, int h, int T,
                                int C, int NH) {
    int hs = C / NH;
    double scale = 1.0 / sqrt((double)hs);
    for (int i = 0; i < T; i++) {
        const float *q = qkv + (b * T + i) * 3 * C + h * hs;
        double m = -INFINITY, sum = 0;
        for (int j = 0; j < T; j++) {
            double s = -INFINITY;
            if (j <= i) {
                const float *k = qkv + (b * T + j) * 3 * C + C + h * hs;
                s = 0;
                for (int d = 0; d < hs; d++) s += (double)q[d] * k[d];
                s *= scale;
            }
            P[i * T + j] = s;
            m = s > m ? s : m;
        }
        for (int j = 0; j <= i; j++) sum += exp(P[i * T + j] - m);
        lse[i] = m + log(sum);
        for (int j = 0; j < T; j++) P[i * T + j] = j <= i ? exp(P[i * T + j] - lse[i]) : 0.0;
    }
}

void ref_attention_forward(float *out, float *lse, const float *qkv, int B, int T, int C, int NH) {
    int hs = C / NH;
    double *P = malloc(sizeof(double) * T * T), *l = malloc(sizeof(double) * T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            ref_attention_probs(P, l, qkv, b, h, T, C, NH);
            for (int i = 0; i < T; i++) {
                lse[(b * NH + h) * T + i] = (float)l[i];
                for (int d = 0; d < hs; d++) {
                    double s = 0;
                    for (int j = 0; j <= i; j++)
                        s += P[i * T + j] * qkv[(b * T + j) * 3 * C + 2 * C + h * hs + d];
                    out[(b * T + i) * C + h * hs + d] = (float)s;
                }
            }
        }
    free(P);
    free(l);
}

void ref_attention_backward(float *dqkv, const float *dout, const float *qkv, int B, int T, int C,
                            int NH) {
    int hs = C / NH;
    double scale = 1.0 / sqrt((double)hs);
    double *P = malloc(sizeof(double) * T * T), *dS = malloc(sizeof(double) * T * T);
    double *l = malloc(sizeof(double) * T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const float *x = qkv + b * T * 3 * C + h * hs, *dy = dout + b * T * C + h * hs;
            float *dx = dqkv + b * T * 3 * C + h * hs;
            ref_attention_probs(P, l, qkv, b, h, T, C, NH);
            for (int i = 0; i < T; i++) {
                double pdp = 0;
                for (int j = 0; j <= i; j++) {
                    double dp = 0; // dP_ij = dO_i . v_j
                    for (int d = 0; d < hs; d++)
                        dp += (double)dy[i * C + d] * x[j * 3 * C + 2 * C + d];
                    dS[i * T + j] = dp;
                    pdp += P[i * T + j] * dp;
                }
                for (int j = 0; j <= i; j++) dS[i * T + j] = P[i * T + j] * (dS[i * T + j] - pdp);
            }
            for (int t = 0; t < T; t++)
                for (int d = 0; d < hs; d++) {
                    double dq = 0, dk = 0, dv = 0;
                    for (int j = 0; j <= t; j++) dq += dS[t * T + j] * x[j * 3 * C + C + d];
                    for (int i = t; i < T; i++) {
                        dk += dS[i * T + t] * x[i * 3 * C + d];
                        dv += P[i * T + t] * dy[i * C + d];
                    }
                    dx[t * 3 * C + d] = (float)(dq * scale);
                    dx[t * 3 * C + C + d] = (float)(dk * scale);
                    dx[t * 3 * C + 2 * C + d] = (float)dv;
                }
        }
    free(P);
    free(dS);
    free(l);
}

static double ref_tanh_arg(double x) { return sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x); }

void ref_gelu_forward(float *out, const float *inp, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        out[i] = (float)(0.5 * inp[i] * (1.0 + tanh(ref_tanh_arg(inp[i]))));
}

void ref_gelu_backward(float *dinp, const float *inp, const float *dout, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        double x = inp[i], th = tanh(ref_tanh_arg(x));
        double g = 0.5 * (1 + th) +
                   0.5 * x * (1 - th * th) * sqrt(2.0 / M_PI) * (1 + 3 * 0.044715 * x * x);
        dinp[i] = (float)(g * dout[i]);
    }
}

void ref_crossentropy(float *losses, float *dlogits, const float *logits, const int32_t *targets,
                      int N, int V, int Vp, float dloss) {
    for (int n = 0; n < N; n++) {
        const float *z = logits + (int64_t)n * Vp;
        double m = -INFINITY, sum = 0;
        for (int j = 0; j < V; j++) m = z[j] > m ? z[j] : m;
        for (int j = 0; j < V; j++) sum += exp(z[j] - m);
        double lse = m + log(sum);
        losses[n] = (float)(lse - z[targets[n]]);
        if (!dlogits) continue;
        for (int j = 0; j < Vp; j++)
            dlogits[(int64_t)n * Vp + j] =
                j < V ? (float)(dloss * (exp(z[j] - lse) - (j == targets[n]))) : 0.0f;
    }
}

void ref_crossentropy_partial(float *partial, const float *logits, const int32_t *targets, int N,
                              int Vl, int vocab_start, int V) {
    int n = V - vocab_start < Vl ? V - vocab_start : Vl;
    for (int i = 0; i < N; i++) {
        const float *z = logits + (int64_t)i * Vl;
        double m = -INFINITY, sum = 0;
        for (int j = 0; j < n; j++) m = z[j] > m ? z[j] : m;
        for (int j = 0; j < n; j++) sum += exp(z[j] - m);
        int t = targets[i] - vocab_start;
        partial[i * 3] = (float)m;
        partial[i * 3 + 1] = (float)sum;
        partial[i * 3 + 2] = t >= 0 && t < Vl ? z[t] : 0.0f;
    }
}
