"""A word-level tokenizer whose words are token ids: ``"t4405 t18654"`` is ``[4405, 18654]``.

The live fleet's servers have dummy weights and no tokenizer; a router that reads
text (SGLang's router accepts a completion's ``prompt`` as text only) needs the
servers to tokenize. This writes a Hugging Face ``tokenizer.json`` (a ``WordLevel``
model over ``t0`` .. ``t<vocab-1>``, split on whitespace, no special tokens added) and
its ``tokenizer_config.json``: ``vllm serve --tokenizer DIR`` then turns
:func:`as_text` of a prompt back into exactly its token ids, so a text client and a
token-id client send the servers the same tokens.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

__all__ = ["as_text", "write_word_tokenizer"]


def as_text(token_ids: Sequence[int]) -> str:
    """The text the tokenizer reads back as ``token_ids``."""
    return " ".join(f"t{t}" for t in token_ids)


def write_word_tokenizer(folder: str | Path, vocab_size: int = 32000) -> Path:
    """Write the tokenizer's two files into ``folder``; returns it."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None,
        "decoder": None,
        "model": {
            "type": "WordLevel",
            "vocab": {f"t{i}": i for i in range(vocab_size)},
            "unk_token": "t0",
        },
    }
    (out / "tokenizer.json").write_text(json.dumps(tokenizer))
    # No special tokens: they are matched inside words first ("t1" would split "t18654").
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 1 << 20}
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out
