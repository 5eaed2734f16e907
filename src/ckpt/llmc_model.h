// llm.c's GPT-2 model files (karpathy/llm.c, train_gpt2.py write_model): a header of 256 int32
// — magic 20240326, version (3: fp32 parameters, 5: bf16), maxT, V, L, NH, C, Vp — followed
// by every parameter tensor in llm.c's order (model/gpt2_params.h lists it), wte padded to Vp rows.
// loom reads versions 3 and 5 and writes version 3.
#pragma once
#include "model/gpt2_config.h"

#include <stdint.h>

enum { LOOM_LLMC_MODEL_MAGIC = 20240326, LOOM_LLMC_FP32 = 3, LOOM_LLMC_BF16 = 5 };

// Reads the header and parameters (converted to fp32) of `path`; *params is malloc'ed with *n
// elements. Errors: LOOM_EIO (missing, unreadable, not a regular file), LOOM_EFORMAT (bad magic,
// unsupported version, invalid dims, a file size that disagrees with the header, or a parameter
// that is NaN or infinite), each naming the file and the value; LOOM_ENOMEM.
loom_status loom_llmc_read(const char *path, loom_gpt2_config *cfg, float **params, int64_t *n);
// The same, and *crc = the CRC-32 (zlib's crc32) of the file's bytes, header included.
loom_status loom_llmc_read_crc(const char *path, loom_gpt2_config *cfg, float **params, int64_t *n,
                               uint32_t *crc);
// Writes a version-3 (fp32) file atomically; *crc (when not NULL) = the CRC-32 of its bytes.
// Errors: LOOM_EIO.
loom_status loom_llmc_write(const char *path, const loom_gpt2_config *cfg, const float *params,
                            int64_t n, uint32_t *crc);
