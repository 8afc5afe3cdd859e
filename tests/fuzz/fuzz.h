/* Shared by the fuzz targets (tests/fuzz/fuzz_*.c): the libFuzzer entry
 * point each defines, and a scratch directory for the parsers that read
 * files rather than memory. Each target is linked twice: with libFuzzer
 * (clang, -Dfuzz=enabled) and with replay.c, a plain main that runs the
 * committed corpus through it under any compiler. */
#ifndef ATLAS_TESTS_FUZZ_FUZZ_H
#define ATLAS_TESTS_FUZZ_FUZZ_H

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A private directory made on first use (removed at exit) and path of
 * name inside it, in buf. */
const char *fuzz_path(const char *name, char *buf, size_t len);
/* Replace the file name of fuzz_path's directory with data: 0 or -1. */
int fuzz_write(const char *name, const void *data, size_t size);

#endif
