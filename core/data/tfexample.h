/* tfexample.h: tf.Example protobufs read in place, without a protobuf library: the features of one
 * TFRecord record by name.
 *
 *   Example   { Features features = 1; }
 *   Features  { map<string, Feature> feature = 1; }     an entry: { string key = 1; Feature value = 2; }
 *   Feature   { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2; Int64List int64_list = 3; } }
 *   BytesList { repeated bytes value = 1; }
 *   FloatList { repeated float value = 1 [packed = true]; }
 *   Int64List { repeated int64 value = 1 [packed = true]; }
 *
 * As protobuf parsers do: packed and unpacked repeated values are both read (and concatenated),
 * unknown fields are skipped, and of two entries with one key (or two kinds in one Feature) the
 * last wins. Nothing is copied: a feature points into the record's bytes. */
#ifndef CT_DATA_TFEXAMPLE_H
#define CT_DATA_TFEXAMPLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum { CT_TFX_MISSING, CT_TFX_BYTES, CT_TFX_FLOAT, CT_TFX_INT64 } ct_tfx_kind;

typedef struct ct_tfx_feature {
    ct_tfx_kind kind;
    const uint8_t *list;         /* the BytesList / FloatList / Int64List message */
    size_t list_len;
    int64_t count;               /* its values */
} ct_tfx_feature;

/* "bytes_list", "float_list", "int64_list" or "missing". */
const char *ct_tfx_kind_name(ct_tfx_kind kind);

/* Feature `name` of the Example buf[0..n) (kind CT_TFX_MISSING when it has none). False, with
 * *why saying what is malformed, when the bytes are not a valid Example. */
bool ct_tfx_find(const uint8_t *buf, size_t n, const char *name, ct_tfx_feature *out, const char **why);

/* Each feature in the order stored (a repeated key once per entry). False as ct_tfx_find. */
typedef void (*ct_tfx_visit)(void *ctx, const char *name, size_t name_len, const ct_tfx_feature *f);
bool ct_tfx_each(const uint8_t *buf, size_t n, ct_tfx_visit visit, void *ctx, const char **why);

/* The f->count values of a float_list, or of an int64_list converted to float. */
void ct_tfx_floats(const ct_tfx_feature *f, float *out);
/* The f->count values of an int64_list. */
void ct_tfx_int64s(const ct_tfx_feature *f, int64_t *out);
/* The k-th value of a bytes_list (0 <= k < f->count). */
void ct_tfx_bytes(const ct_tfx_feature *f, int64_t k, const uint8_t **p, size_t *len);

#endif
