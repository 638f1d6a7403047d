"""A byte-level BPE tokenizer (no merges) in Hugging Face `tokenizers` JSON, for the tiny model.

Ids 0 and 1 are DeepSeek's BOS/EOS special tokens, ids 2..257 the 256 bytes
(GPT-2's byte-to-unicode mapping), so any text encodes and decodes losslessly.
"""

from __future__ import annotations

import json

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars = keep[:]
    n = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(keep, chars)}


def encode(text: str) -> list[int]:
    """Token ids of `text` under this tokenizer (BOS first), without the tokenizers library."""
    return [0] + [2 + b for b in text.encode("utf-8")]


def decode(ids: list[int]) -> str:
    return bytes(i - 2 for i in ids if 2 <= i < 258).decode("utf-8", errors="replace")


def tokenizer_files(config: dict) -> dict[str, str]:
    b2u = byte_to_unicode()
    vocab = {BOS: 0, EOS: 1}
    for b in range(256):
        vocab[b2u[b]] = 2 + b
    special = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                "normalized": False, "special": True} for t, i in ((BOS, 0), (EOS, 1))]
    tok = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": special,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": BOS, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"SpecialToken": {"id": BOS, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                                    {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {BOS: {"id": BOS, "ids": [0], "tokens": [BOS]}}},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }
    cfg = {"add_bos_token": True, "add_eos_token": False, "bos_token": BOS, "eos_token": EOS,
           "pad_token": EOS, "legacy": True, "clean_up_tokenization_spaces": False,
           "model_max_length": int(config.get("max_position_embeddings", 16384)),
           "tokenizer_class": "LlamaTokenizerFast"}
    return {"tokenizer.json": json.dumps(tok, ensure_ascii=False, indent=1) + "\n",
            "tokenizer_config.json": json.dumps(cfg, ensure_ascii=False, indent=2) + "\n"}


def is_this_tokenizer(tokenizer_json) -> bool:
    """Whether the file `tokenizer_json` is this tokenizer's (what `dsx tiny` writes and an export of it copies)."""
    try:
        with open(tokenizer_json, encoding="utf-8") as f:
            return f.read() == tokenizer_files({})["tokenizer.json"]
    except (OSError, UnicodeDecodeError):
        return False
