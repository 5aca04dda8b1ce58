/* Lesson 13, the caller: a plain C program using the model the build compiled (tiny_lm.h, from
 * qkv_add_library). It needs no qkv, LLVM or C++ at run time. It runs the model at two lengths
 * (the sizes are arguments), checks the logits against the same model written out in C, checks
 * that a token never sees the tokens after it, and that a token id outside the table is refused. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include "tiny_lm.h"

enum { kVocab = 16, kModel = 8, kBatch = 2, kMaxSeq = 7 };

/* The model by hand: logits[b][i] = E · (Σ_j≤i softmax_j(x_i·x_j / √8) x_j), x_i = E[ids[b][i]]. */
static void reference(const float* embed, const int64_t* ids, int64_t batch, int64_t seq, double* logits) {
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < seq; ++i) {
      const float* xi = embed + ids[b * seq + i] * kModel;
      double s[kMaxSeq], m = -INFINITY, sum = 0, h[kModel] = {0};
      for (int64_t j = 0; j <= i; ++j) {
        const float* xj = embed + ids[b * seq + j] * kModel;
        s[j] = 0;
        for (int e = 0; e < kModel; ++e) s[j] += (double)xi[e] * xj[e];
        s[j] /= sqrt((double)kModel);
        if (s[j] > m) m = s[j];
      }
      for (int64_t j = 0; j <= i; ++j) sum += (s[j] = exp(s[j] - m));
      for (int64_t j = 0; j <= i; ++j)
        for (int e = 0; e < kModel; ++e) h[e] += s[j] / sum * embed[ids[b * seq + j] * kModel + e];
      for (int v = 0; v < kVocab; ++v) {
        double acc = 0;
        for (int e = 0; e < kModel; ++e) acc += h[e] * embed[v * kModel + e];
        logits[(b * seq + i) * kVocab + v] = acc;
      }
    }
}

int main(void) {
  float embed[kVocab * kModel];
  for (int k = 0; k < kVocab * kModel; ++k) embed[k] = (float)sin(0.7 * k + 0.3);
  int64_t ids[kBatch * kMaxSeq]; /* token ids: int64_t, as the graph's input is i64 */
  float logits[kBatch * kMaxSeq * kVocab];
  double want[kBatch * kMaxSeq * kVocab];
  int ok = 1;
  for (int64_t seq = 4; seq <= kMaxSeq; seq += kMaxSeq - 4) {
    for (int64_t k = 0; k < kBatch * seq; ++k) ids[k] = (k * 5 + 3) % kVocab;
    const int rc = tiny_lm(kBatch, seq, embed, ids, logits);
    reference(embed, ids, kBatch, seq, want);
    double worst = 0;
    for (int64_t k = 0; k < kBatch * seq * kVocab; ++k)
      if (!(fabs(logits[k] - want[k]) <= worst)) worst = fabs(logits[k] - want[k]);
    printf("Batch %d, Seq %d: returned %d, max |C - qkv| over the logits %.2g\n", kBatch, (int)seq, rc, worst);
    ok = ok && rc == 0 && worst < 1e-4;
  }
  /* Causality: changing the last token leaves every earlier position's logits as they were. */
  float before[kMaxSeq * kVocab];
  for (int k = 0; k < kMaxSeq * kVocab; ++k) before[k] = logits[k];
  ids[kMaxSeq - 1] = (ids[kMaxSeq - 1] + 1) % kVocab;
  ok = ok && tiny_lm(kBatch, kMaxSeq, embed, ids, logits) == 0;
  int same = 1, changed = 0;
  for (int k = 0; k < (kMaxSeq - 1) * kVocab; ++k) same = same && logits[k] == before[k];
  for (int k = (kMaxSeq - 1) * kVocab; k < kMaxSeq * kVocab; ++k) changed = changed || logits[k] != before[k];
  printf("a new last token changes only the last position: %s\n", same && changed ? "yes" : "NO");
  ok = ok && same && changed;
  /* A token id outside [0, 16) is refused (3), as the header says. */
  ids[0] = kVocab;
  const int bad = tiny_lm(kBatch, kMaxSeq, embed, ids, logits);
  printf("token id %d: returned %d\n", kVocab, bad);
  ok = ok && bad == 3;
  puts(ok ? "lesson 13: ok" : "lesson 13: FAILED");
  return ok ? 0 : 1;
}
