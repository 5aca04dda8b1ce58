/* The .safetensors reader of the AOT C programs (tests/e2e/aot): one F32 tensor by name, found in
 * the file's JSON header by plain string search (enough for the files PyTorch's fixtures hold). */
#ifndef QKV_TEST_SAFETENSORS_READ_H
#define QKV_TEST_SAFETENSORS_READ_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Tensor `name` of the file at `path`: `count` F32 elements (malloc'd); exits with a message when
 * the file or the tensor is not as expected. */
static inline float* read_safetensors_f32(const char* path, const char* name, long count) {
  FILE* f = fopen(path, "rb");
  unsigned char size[8];
  if (!f || fread(size, 1, 8, f) != 8) {
    fprintf(stderr, "cannot read %s\n", path);
    exit(1);
  }
  uint64_t n = 0;
  for (int k = 7; k >= 0; --k) n = (n << 8) | size[k];
  if (n == 0 || n > (64u << 20)) {
    fprintf(stderr, "%s: a header of %llu bytes\n", path, (unsigned long long)n);
    exit(1);
  }
  char* header = malloc((size_t)n + 1);
  if (!header || fread(header, 1, (size_t)n, f) != (size_t)n) {
    fprintf(stderr, "%s: cannot read its header\n", path);
    exit(1);
  }
  header[n] = '\0';
  char key[1024];
  snprintf(key, sizeof key, "\"%s\":", name);
  const char* at = strstr(header, key);
  const char* end = at ? strchr(at, '}') : NULL;
  const char* dtype = at ? strstr(at, "\"dtype\":\"F32\"") : NULL;
  const char* offsets = at ? strstr(at, "\"data_offsets\":[") : NULL;
  long long begin = -1, stop = -1;
  if (!end || !dtype || dtype > end || !offsets || offsets > end ||
      sscanf(offsets + strlen("\"data_offsets\":["), "%lld,%lld", &begin, &stop) != 2 ||
      stop - begin != (long long)count * 4) {
    fprintf(stderr, "%s: no F32 tensor %s of %ld elements\n", path, name, count);
    exit(1);
  }
  float* data = malloc((size_t)count * sizeof(float));
  if (!data || fseek(f, (long)(8 + n + (uint64_t)begin), SEEK_SET) != 0 ||
      fread(data, sizeof(float), (size_t)count, f) != (size_t)count) {
    fprintf(stderr, "%s: cannot read %s\n", path, name);
    exit(1);
  }
  free(header);
  fclose(f);
  return data;
}

#endif /* QKV_TEST_SAFETENSORS_READ_H */
