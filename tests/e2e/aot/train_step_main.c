/* A plain C program trains the tiny Llama of a PyTorch training fixture
 * (tests/numerics/train_fixtures/<case>, make_train_fixtures.py) with the step `qkv emit
 * train-step --function tiny_llama` compiled: the weights from the fixture's weights.safetensors
 * by the header's tiny_llama_weight_names, the optimizer state from zeros, the batch (tokens,
 * targets; positions 0 .. Seq-1) from its .npy files; then `steps` (case.json) calls of
 * tiny_llama_step, each writing the new weights and state into the other of two buffers.
 *
 *   usage: train_step_main FIXTURE_DIR LR
 *
 * Checked against PyTorch within the tolerances tests/numerics/test_train.cpp holds the
 * interpreter to (the fixture's loss_tol, norm_tol and per-weight tol: 4 x PyTorch's own fp32
 * error against fp64): the loss and the gradients' norm at every step, every weight after the
 * last. Exit 0 when all agree, 1 otherwise. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "npy_read.h"
#include "safetensors_read.h"
#include "tiny_llama.h"

/* The number after "key": in the (compacted) JSON text, or exit. */
static double json_number(const char* text, const char* key) {
  char quoted[512];
  snprintf(quoted, sizeof quoted, "\"%s\":", key);
  const char* at = strstr(text, quoted);
  if (!at) {
    fprintf(stderr, "case.json has no %s\n", key);
    exit(1);
  }
  return strtod(at + strlen(quoted), NULL);
}

static int near(double got, double want, double tol, const char* what, int step) {
  const int ok = fabs(got - want) <= tol;
  printf("%s %s at step %d: %.9g (PyTorch %.9g, |diff| %.3g, allowed %.3g)\n", ok ? "ok  " : "FAIL", what, step, got,
         want, fabs(got - want), tol);
  return ok;
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s FIXTURE_DIR LR\n", argv[0]);
    return 1;
  }
  const char* dir = argv[1];
  const float lr = (float)atof(argv[2]);
  char path[4096];
  snprintf(path, sizeof path, "%s/case.json", dir);
  FILE* cf = fopen(path, "rb");
  char text[65536];
  const size_t text_len = cf ? fread(text, 1, sizeof text - 1, cf) : 0;
  if (!cf || text_len == 0) {
    fprintf(stderr, "cannot read %s\n", path);
    return 1;
  }
  fclose(cf);
  text[text_len] = '\0';
  /* Compact the JSON (the fixture writer indents it): "key": value -> "key":value. */
  {
    size_t o = 0;
    for (size_t i = 0; i < text_len; ++i)
      if (text[i] != ' ' && text[i] != '\n') text[o++] = text[i];
    text[o] = '\0';
  }
  const int steps = (int)json_number(text, "steps");
  const double loss_tol = json_number(text, "loss_tol"), norm_tol = json_number(text, "norm_tol");
  const char* tol_table = strstr(text, "\"tol\":");
  if (!tol_table) {
    fprintf(stderr, "case.json has no tol\n");
    return 1;
  }

  /* Two buffers for the weights and for the state: a step reads one and writes the other. */
  float* weights[2][TINY_LLAMA_NUM_WEIGHTS];
  float* state[2][TINY_LLAMA_NUM_STATE + 1];
  snprintf(path, sizeof path, "%s/weights.safetensors", dir);
  for (int i = 0; i < TINY_LLAMA_NUM_WEIGHTS; ++i) {
    const long n = (long)tiny_llama_weight_numel[i];
    weights[0][i] = read_safetensors_f32(path, tiny_llama_weight_names[i], n);
    weights[1][i] = malloc((size_t)n * sizeof(float));
    for (int k = 0; k < TINY_LLAMA_STATE_PER_WEIGHT; ++k) {
      state[0][i * TINY_LLAMA_STATE_PER_WEIGHT + k] = calloc((size_t)n, sizeof(float));
      state[1][i * TINY_LLAMA_STATE_PER_WEIGHT + k] = calloc((size_t)n, sizeof(float));
    }
  }
  int64_t* tokens = read_npy(dir, "tokens", TINY_LLAMA_TOKENS_NUMEL, sizeof(int64_t));
  int64_t* targets = read_npy(dir, "targets", TINY_LLAMA_TARGETS_NUMEL, sizeof(int64_t));
  int64_t positions[TINY_LLAMA_POSITIONS_NUMEL];
  for (int i = 0; i < TINY_LLAMA_POSITIONS_NUMEL; ++i) positions[i] = i % TINY_LLAMA_SEQ;
  double* losses = read_npy(dir, "losses", steps, sizeof(double));
  double* norms = read_npy(dir, "grad_norms", steps, sizeof(double));

  int ok = 1, cur = 0;
  for (int s = 0; s < steps; ++s, cur ^= 1) {
    float loss = NAN, grad_norm = NAN;
    const int rc = tiny_llama_step((const float* const*)weights[cur], (const float* const*)state[cur], tokens,
                                   positions, targets, lr, (float)(s + 1), weights[cur ^ 1], state[cur ^ 1], &loss,
                                   &grad_norm);
    if (rc != 0) {
      fprintf(stderr, "tiny_llama_step returned %d%s%s\n", rc, rc == TINY_LLAMA_ERROR_CPU ? ": " : "",
              rc == TINY_LLAMA_ERROR_CPU ? tiny_llama_check_cpu() : "");
      return 1;
    }
    ok &= near(loss, losses[s], loss_tol, "loss     ", s + 1);
    ok &= near(grad_norm, norms[s], norm_tol, "grad_norm", s + 1);
  }
  /* The weights after the last step against PyTorch's. */
  snprintf(path, sizeof path, "%s/after", dir);
  for (int i = 0; i < TINY_LLAMA_NUM_WEIGHTS; ++i) {
    const long n = (long)tiny_llama_weight_numel[i];
    double* want = read_npy(path, tiny_llama_weight_names[i], n, sizeof(double));
    const double tol = json_number(tol_table, tiny_llama_weight_names[i]);
    double worst = 0;
    for (long k = 0; k < n; ++k) worst = fmax(worst, fabs(weights[cur][i][k] - want[k]));
    int good = worst <= tol; /* and no NaN, which fmax would drop */
    for (long k = 0; k < n; ++k) good &= isfinite(weights[cur][i][k]) != 0;
    printf("%s %s after %d steps: max |diff| %.3g (allowed %.3g)\n", good ? "ok  " : "FAIL",
           tiny_llama_weight_names[i], steps, worst, tol);
    ok &= good;
    free(want);
  }
  printf(ok ? "the compiled training step matches PyTorch\n" : "MISMATCH\n");
  return ok ? 0 : 1;
}
