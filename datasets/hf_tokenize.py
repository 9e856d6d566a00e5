#!/usr/bin/env python3
"""Tokenize text files with a model's own tokenizer (its tokenizer.json) into ctrain token files.

Usage: datasets/hf_tokenize.py --tokenizer TOKENIZER.json FILE... --out DIR [--eval-fraction F]
                               [--separator TOKEN | --no-separator] [--vocab V]

A Hugging Face model directory (Llama, SmolLM, TinyLlama, Mistral, ...) carries tokenizer.json,
the tokenizer the model was trained with; this script runs it (the `tokenizers` package from PyPI:
pip install tokenizers) over each FILE in the order given, one document per file, with the
separator token between documents (default: the first of the tokenizer's special tokens that ends
a text, "</s>", "<|endoftext|>", "<|end_of_text|>", "<|im_end|>", "<eos>"; none found: an error
asking for --separator or --no-separator). The ids are written as ctrain's token file
(docs/formats.md, "ctrain token files"): 2 bytes per token when the vocabulary fits 65536, else 4,
the vocabulary in the header (the tokenizer's size, or --vocab V for a model whose embedding has
more rows, e.g. a padded one). Output: DIR/tokens.bin, or with --eval-fraction F (0 < F < 1)
DIR/train.bin and DIR/eval.bin, eval holding the last floor(F x tokens) tokens. An entry then
reads it as {"format": "tokens", "path": "DIR/train.bin", "seq_len": T}.

Errors name the file and exit 1 (2 for usage): an unreadable file, text that is not UTF-8, a
tokenizer that does not load, a --vocab below the tokenizer's largest id.
"""
import argparse
import os
import struct
import sys
import zlib

ENDS = ("</s>", "<|endoftext|>", "<|end_of_text|>", "<|im_end|>", "<eos>")


def fail(msg, code=1):
    print("hf_tokenize: error: " + msg, file=sys.stderr)
    sys.exit(code)


def write_tokens(path, ids, vocab):
    """ctrain's token file: magic, version 1, bytes per token, count, vocabulary, CRC-32 of those
    28 bytes, then the tokens (little-endian), written to a temporary name and renamed."""
    width = 2 if vocab <= 65536 else 4
    head = b"CTTOKENS" + struct.pack("<IIQI", 1, width, len(ids), vocab)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(head + struct.pack("<I", zlib.crc32(head)))
        f.write(struct.pack("<%d%s" % (len(ids), "H" if width == 2 else "I"), *ids))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def separator_id(tok, args):
    if args.no_separator:
        return None
    names = [args.separator] if args.separator else ENDS
    for name in names:
        i = tok.token_to_id(name)
        if i is not None:
            return i
    if args.separator:
        fail("--separator %r is not a token of %s" % (args.separator, args.tokenizer), 2)
    fail("%s has none of the end-of-text tokens %s: name one with --separator TOKEN, or give "
         "--no-separator" % (args.tokenizer, ", ".join(ENDS)), 2)


def main():
    ap = argparse.ArgumentParser(description="tokenize text with a tokenizer.json into ctrain token files")
    ap.add_argument("--tokenizer", required=True, help="the model's tokenizer.json")
    ap.add_argument("files", nargs="+", metavar="FILE")
    ap.add_argument("--out", required=True)
    ap.add_argument("--eval-fraction", type=float, default=0.0)
    ap.add_argument("--separator", help="the token between documents (default: the tokenizer's end of text)")
    ap.add_argument("--no-separator", action="store_true")
    ap.add_argument("--vocab", type=int, default=0, help="the vocabulary in the header (default: the tokenizer's)")
    args = ap.parse_args()
    if not 0.0 <= args.eval_fraction < 1.0:
        fail("--eval-fraction must be in [0, 1), got %g" % args.eval_fraction, 2)
    try:
        from tokenizers import Tokenizer
    except ImportError:
        fail("the tokenizers package is not installed (pip install tokenizers)")
    try:
        tok = Tokenizer.from_file(args.tokenizer)
    except Exception as e:  # the library's own exception types vary between releases
        fail("%s: not a tokenizer this version of tokenizers loads: %s" % (args.tokenizer, e))
    sep = separator_id(tok, args)
    ids = []
    for path in args.files:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except UnicodeDecodeError as e:
            fail("%s: not UTF-8 text (byte %d)" % (path, e.start))
        except OSError as e:
            fail("%s: %s" % (path, e.strerror))
        ids += tok.encode(text, add_special_tokens=False).ids
        if sep is not None:
            ids.append(sep)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    top = max(ids) if ids else 0
    if args.vocab and args.vocab <= top:
        fail("--vocab %d is not above the largest id %d" % (args.vocab, top), 2)
    vocab = args.vocab or max(vocab, top + 1)
    os.makedirs(args.out, exist_ok=True)
    n_eval = int(len(ids) * args.eval_fraction)
    if args.eval_fraction > 0:
        write_tokens(os.path.join(args.out, "train.bin"), ids[:len(ids) - n_eval], vocab)
        write_tokens(os.path.join(args.out, "eval.bin"), ids[len(ids) - n_eval:], vocab)
    else:
        write_tokens(os.path.join(args.out, "tokens.bin"), ids, vocab)
    print("tokenized %d file(s) into %d tokens (vocabulary %d, %d bytes per token)%s in %s" % (
        len(args.files), len(ids), vocab, 2 if vocab <= 65536 else 4,
        ": %d train, %d eval" % (len(ids) - n_eval, n_eval) if n_eval else "", args.out))


if __name__ == "__main__":
    main()
