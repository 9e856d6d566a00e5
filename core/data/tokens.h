/* tokens.h: binary token files for language models (byte layout in docs/formats.md).
 *
 * A 32-byte header (magic "CTTOKENS", version, bytes per token 2 or 4, token count, vocabulary
 * size, CRC32 of the header) followed by the tokens, little-endian. A sample is a window of
 * seq_len + 1 tokens starting at i * seq_len: input = tokens [0, seq_len), target = [1, seq_len]. */
#ifndef CT_DATA_TOKENS_H
#define CT_DATA_TOKENS_H

#include "core/util/common.h"

#define CT_TOKENS_MAGIC "CTTOKENS"
#define CT_TOKENS_VERSION 1u
#define CT_TOKENS_HEADER 32u

/* Write tokens (n of them, each < vocab) to path with `width` bytes per token (2 or 4). */
int ct_tokens_write(const char *path, const uint32_t *tokens, uint64_t n, int width, uint32_t vocab,
                    ct_err *err);

#endif
