"""The repository's tiny model folder is one ``vllm serve`` takes as written in
adapters/README.md: a Llama ``config.json`` and a tokenizer (the word-level one
``tests/serve/harness/word_tokenizer.py`` writes, not a hand-edited copy); no weights,
so the command says ``--load-format dummy``. ``make test-serve`` runs the command."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import ROOT
from word_tokenizer import as_text, write_word_tokenizer

FOLDER = ROOT / "tests" / "serve" / "harness" / "tiny-llama"


def test_the_tokenizer_files_are_the_generated_ones(tmp_path: Path) -> None:
    config = json.loads((FOLDER / "config.json").read_text())
    made = write_word_tokenizer(tmp_path, config["vocab_size"])
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (FOLDER / name).read_bytes() == (made / name).read_bytes(), name
    assert not list(FOLDER.glob("*.safetensors"))  # no weights: --load-format dummy


def test_the_readme_command_serves_this_folder_with_dummy_weights() -> None:
    text = (ROOT / "adapters" / "README.md").read_text(encoding="utf-8").replace("\\\n", " ")
    serve = [ln for ln in text.splitlines() if "vllm serve tests/serve/harness/tiny-llama" in ln]
    assert serve and all("--load-format dummy" in ln for ln in serve)
    assert all("--host 127.0.0.1" in ln for ln in serve)
    (curl,) = [ln for ln in text.splitlines() if ln.startswith("curl ") and "tiny-llama" in ln]
    prompt = json.loads(curl.split("-d '", 1)[1].rsplit("'", 1)[0])["prompt"]
    vocab = json.loads((FOLDER / "tokenizer.json").read_text())["model"]["vocab"]
    ids = [vocab[w] for w in prompt.split()]  # every word is in the tokenizer
    assert as_text(ids) == prompt
