/* pack.h: `ctrain pack`: convert a dataset to ctrain's packed formats.
 *
 *   ctrain pack --from image_folder ROOT --out DIR [--shard-size MB] [--compress]
 *   ctrain pack --from idx IMAGES [--labels LABELS] --out DIR [--shard-size MB] [--compress]
 *   ctrain pack --from text FILE --out DIR          (byte-level tokens: DIR/tokens.bin)
 *
 * Images are stored as decoded u8 pixels [C, H, W] (idx files of other element types as f32) in
 * shard-NNNNNN.cts files; use them with {"format": "shard", "path": DIR}. For idx, LABELS
 * defaults to IMAGES with "images-idx3" replaced by "labels-idx1" (the MNIST file names). */
#ifndef CT_DATA_PACK_H
#define CT_DATA_PACK_H

#include "core/common.h"

/* argv[0] is "pack". Prints a summary line to stdout. Returns CT_OK, CT_ERR_CONFIG (usage),
 * CT_ERR_DATA (unreadable or corrupt input) or CT_ERR_RUNTIME (cannot write). */
int ct_pack_main(int argc, char **argv, ct_err *err);

#endif
