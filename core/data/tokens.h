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

/* llm.c's .bin shards (also read by the tokens format): 256 x int32 header, magic, version 1 =
 * uint16 tokens, count; no vocabulary in the header, so GPT-2's unless the entry gives "vocab". */
#define CT_LLMC_MAGIC 20240520u
#define CT_LLMC_HEADER 1024u
#define CT_LLMC_VOCAB 50257u

/* Write tokens (n of them, each < vocab) to path with `width` bytes per token (2 or 4). */
int ct_tokens_write(const char *path, const uint32_t *tokens, uint64_t n, int width, uint32_t vocab,
                    ct_err *err);

#endif
