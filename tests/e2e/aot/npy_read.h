/* The .npy reader of the AOT C programs (tests/e2e/aot): enough of the format for the files
 * `qkv emit --example-dir` writes. */
#ifndef QKV_TEST_NPY_READ_H
#define QKV_TEST_NPY_READ_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Reads a little-endian .npy (format 1.0 or 2.0) of `count` elements of `elem_size` bytes. */
static inline void* read_npy(const char* dir, const char* name, long count, size_t elem_size) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s.npy", dir, name);
  FILE* f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "cannot open %s\n", path);
    exit(1);
  }
  unsigned char magic[10];
  if (fread(magic, 1, 10, f) != 10 || memcmp(magic, "\x93NUMPY", 6) != 0) {
    fprintf(stderr, "%s is not a .npy file\n", path);
    exit(1);
  }
  long header = magic[8] | (magic[9] << 8);
  long skip = header;
  if (magic[6] >= 2) { /* 4-byte header length: 2 bytes read already */
    unsigned char more[2];
    if (fread(more, 1, 2, f) != 2) exit(1);
    header = (long)magic[8] | ((long)magic[9] << 8) | ((long)more[0] << 16) | ((long)more[1] << 24);
    skip = header;
  }
  if (fseek(f, skip, SEEK_CUR) != 0) exit(1);
  void* data = malloc((size_t)count * elem_size);
  if (!data || fread(data, elem_size, (size_t)count, f) != (size_t)count) {
    fprintf(stderr, "%s: expected %ld elements\n", path, count);
    exit(1);
  }
  fclose(f);
  return data;
}

/* Reads the whole payload of a little-endian .npy (any dtype and shape): its bytes, *bytes set. */
static inline void* read_npy_bytes(const char* dir, const char* name, long* bytes) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s.npy", dir, name);
  FILE* f = fopen(path, "rb");
  unsigned char magic[12];
  if (!f || fread(magic, 1, 10, f) != 10 || memcmp(magic, "\x93NUMPY", 6) != 0) {
    fprintf(stderr, "%s is not a .npy file\n", path);
    exit(1);
  }
  long header = magic[8] | (magic[9] << 8), start = 10 + header;
  if (magic[6] >= 2) {
    if (fread(magic + 10, 1, 2, f) != 2) exit(1);
    header = (long)magic[8] | ((long)magic[9] << 8) | ((long)magic[10] << 16) | ((long)magic[11] << 24);
    start = 12 + header;
  }
  if (fseek(f, 0, SEEK_END) != 0) exit(1);
  *bytes = ftell(f) - start;
  if (*bytes < 0 || fseek(f, start, SEEK_SET) != 0) exit(1);
  void* data = malloc((size_t)*bytes + 1);
  if (!data || fread(data, 1, (size_t)*bytes, f) != (size_t)*bytes) {
    fprintf(stderr, "%s: cannot read its %ld bytes\n", path, *bytes);
    exit(1);
  }
  fclose(f);
  return data;
}

#endif /* QKV_TEST_NPY_READ_H */
