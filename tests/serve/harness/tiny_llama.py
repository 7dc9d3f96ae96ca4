"""A tiny Llama whose greedy outputs depend on its context: ``config.json`` plus random
weights drawn from a seed, written as a safetensors checkpoint ``vllm serve`` loads.

Why not ``--load-format dummy``: vLLM's dummy loader fills every weight uniformly in
[-1e-3, 1e-3], so attention adds next to nothing to the residual stream and the greedy
next token is a function of the current token alone -- a request served with the wrong
KV (a hit handing out another block's contents) answers the same, and "equal outputs"
would not show "equal KV". Here the projections are normal with a standard deviation
of 0.1 and the embeddings of 1: attention scores spread over several units and its
output outweighs the token's own embedding, so the context decides the next token
(``make test-serve`` was seen to fail when a cache hit's first block was swapped for
another). Weights are float32 (``config.json``'s dtype): two engines computing the
same KV in different batches then agree to the last greedy token.

    python tests/serve/harness/tiny_llama.py OUT_DIR [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
from pathlib import Path

CONFIG = Path(__file__).resolve().parent / "tiny-llama" / "config.json"
PROJECTION_STD = 0.1
EMBEDDING_STD = 1.0


def write_model(directory: str | Path, seed: int = 0) -> Path:
    """Write ``config.json`` and ``model.safetensors`` into ``directory``; return it.

    The same seed gives the same bytes (torch's CPU generator).
    """
    import torch
    from safetensors.torch import save_file

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(CONFIG, out / "config.json")
    cfg = json.loads(CONFIG.read_text())
    hidden, inter, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    head_dim = hidden // cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"] * head_dim
    gen = torch.Generator().manual_seed(seed)

    def normal(*shape: int, std: float = PROJECTION_STD) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float32) * std

    tensors = {
        "model.embed_tokens.weight": normal(vocab, hidden, std=EMBEDDING_STD),
        "model.norm.weight": torch.ones(hidden),
        "lm_head.weight": normal(vocab, hidden),
    }
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        tensors |= {
            p + "input_layernorm.weight": torch.ones(hidden),
            p + "post_attention_layernorm.weight": torch.ones(hidden),
            p + "self_attn.q_proj.weight": normal(hidden, hidden),
            p + "self_attn.k_proj.weight": normal(kv, hidden),
            p + "self_attn.v_proj.weight": normal(kv, hidden),
            p + "self_attn.o_proj.weight": normal(hidden, hidden),
            p + "mlp.gate_proj.weight": normal(inter, hidden),
            p + "mlp.up_proj.weight": normal(inter, hidden),
            p + "mlp.down_proj.weight": normal(hidden, inter),
        }
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def write_model_with(vllm: str | Path, directory: str | Path) -> Path:
    """Write the model with the serving environment's Python (``vllm``'s folder): it has
    torch and safetensors, which the project's own environment need not have."""
    python = Path(vllm).parent / "python"
    subprocess.run([str(python), __file__, str(directory)], check=True, stdout=subprocess.DEVNULL)
    return Path(directory)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="the model directory to write")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(write_model(args.out, args.seed))


if __name__ == "__main__":
    main()
