#!/usr/bin/env python3
"""Writes the model configs under configs/ (run from anywhere: python3 configs/generate.py).

- configs/<design>-<size>.json: the named settings of MODELS.md section 7 for every design
  where the papers use them (HC, mHC, DenseFormer and MUDDFormer have no 1.3B setting in the
  SATFormer paper), and the DAR 7B MoE setting with its two baselines.
- configs/cpu/<design>.json: the same designs at a CPU size (d=128, L=4), for demos and tests.
- configs/bench/<design>.json: the designs at the benchmark shape (d=384, L=6, vocab 256).
The files are committed; configs_test checks that every one loads.
"""
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))

SIZES = {  # name: (d, L, H, dff, Block AttnRes/DAR block_size ~ 2L/4..2L/8 sublayers)
    "130m": (768, 11, 12, 3072, 4),
    "340m": (1024, 18, 16, 4096, 6),
    "760m": (1536, 19, 24, 6144, 6),
    "1.3b": (2048, 24, 32, 5632, 6),
}

# Design name -> the config fields that select it (block_size filled in per size).
DESIGNS = {
    "transformer": {},
    "resformer": {"value_residual": "resformer", "resformer_mode": "learnable_plus"},
    "satformer": {"value_residual": "satformer"},
    "attnres": {"residual": "attnres", "block_size": None},
    # Transparent Attention (Bapna et al. 2018) in its full form: every sublayer output a source.
    "transparent": {"residual": "transparent"},
    "dar": {"residual": "dar", "block_size": None},
    "dar-full": {"residual": "dar", "block_size": 2},
    "hc": {"residual": "hc", "hc_streams": 4},
    "mhc": {"residual": "mhc", "hc_streams": 4},
    "denseformer": {"residual": "denseformer"},
    "muddformer": {"residual": "muddformer"},
}
NO_XL = {"hc", "mhc", "denseformer", "muddformer"}


def design_fields(design, block_size):
    fields = dict(DESIGNS[design])
    if fields.get("block_size", 0) is None:
        fields["block_size"] = block_size
    return fields


def base(vocab, d, layers, heads, dff, ctx):
    return {
        "vocab_size": vocab, "hidden_size": d, "intermediate_size": dff,
        "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": heads, "max_position_embeddings": ctx,
        "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
        "qk_norm": True, "initializer_range": 0.02,
    }


def write(path, config):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")


def main():
    for size, (d, layers, heads, dff, block) in SIZES.items():
        for design in DESIGNS:
            if size == "1.3b" and design in NO_XL:
                continue
            config = base(32000, d, layers, heads, dff, 4096)
            config.update(design_fields(design, block))
            write(os.path.join(HERE, f"{design}-{size}.json"), config)
    # The 7B MoE setting (OLMoE-1B-7B shape: 6.9B total, 1.3B active), DAR and baselines.
    moe = {"num_experts": 64, "top_k": 8, "expert_intermediate_size": 1024,
           "num_shared_experts": 0, "router_aux_loss_coef": 0.01,
           "router_z_loss_coef": 0.001, "norm_topk_prob": False}
    for design, fields in (("dar", {"residual": "dar", "block_size": 8}),
                           ("attnres", {"residual": "attnres", "block_size": 8}),
                           ("transformer", {})):
        config = base(50304, 2048, 16, 16, 1024, 4096)
        del config["intermediate_size"]
        config["tie_word_embeddings"] = False
        config.update(fields)
        config["moe"] = moe
        write(os.path.join(HERE, f"{design}-moe-7b.json"), config)
    for folder, (vocab, d, layers, heads, kv, dff, ctx, block) in (
            ("cpu", (256, 128, 4, 4, 2, 512, 512, 4)),
            ("bench", (256, 384, 6, 6, 6, 1536, 1024, 4))):
        for design in DESIGNS:
            config = base(vocab, d, layers, heads, dff, ctx)
            config["num_key_value_heads"] = kv
            config.update(design_fields(design, block))
            write(os.path.join(HERE, folder, f"{design}.json"), config)
        config = base(vocab, d, layers, heads, dff, ctx)
        del config["intermediate_size"]
        config["num_key_value_heads"] = kv
        config.update({"residual": "dar", "block_size": block, "value_residual": "satformer"})
        config["moe"] = {"num_experts": 8, "top_k": 2, "expert_intermediate_size": dff // 4,
                         "num_shared_experts": 0, "router_aux_loss_coef": 0.01,
                         "router_z_loss_coef": 0.001, "norm_topk_prob": False}
        write(os.path.join(HERE, folder, "dar-moe.json"), config)


if __name__ == "__main__":
    main()
