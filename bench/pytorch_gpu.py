#!/usr/bin/env python3
"""PyTorch 2 eager GPU training of a satdar model, for the side-by-side GPU benchmark.

Builds the model a satdar config describes with the independent reference implementation
(tests/reference/torch_model.py: every design of MODELS.md), swaps its attention for
PyTorch's fused scaled_dot_product_attention (flash / memory-efficient kernels), and trains
it on uniformly random tokens with fp32 master weights under bf16 autocast and a fused AdamW
(lr 1e-3, betas (0.9, 0.95), weight decay 0.1, clipping at 1.0), the way satdar trains on a
GPU. Prints one JSON line: tokens/s (timed after the warm-up steps), MFU against the bf16
dense peak, peak GPU memory.

    python3 bench/pytorch_gpu.py --config configs/satformer-760m.json --batch-size 8 \
        --seq-len 2048 --steps 30 --warmup-steps 5

MFU counts 6 x parameters (for MoE the active ones: top_k of the routed experts) FLOPs per
token (the embedding table counted once, as the head's matmul) plus causal
attention's 6 x L x T x d (half of the 12 L T d of full attention), over the peak
(--peak-tflops, 989 for an H100/H200 SXM in bf16 dense).
Needs PyTorch >= 2.0 and a CUDA device.
"""

import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir,
                                'tests', 'reference'))
import torch_model  # pylint: disable=wrong-import-position


def sdpa_attend(self, q, k, v, state):
    """torch_model.Attention.attend with PyTorch's fused causal attention."""
    del state  # is_causal replaces the explicit mask
    b, h, t, dh = q.shape
    n = k.shape[1]
    if h != n:  # GQA: query head j reads KV head j // (h / n)
        k = k.repeat_interleave(h // n, dim=1)
        v = v.repeat_interleave(h // n, dim=1)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return out.transpose(1, 2).reshape(b, t, h * dh)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n', maxsplit=1)[0])
    parser.add_argument('--config', required=True)
    parser.add_argument('--layers', type=int, default=0, help='override num_hidden_layers')
    parser.add_argument('--batch-size', type=int, default=8)
    parser.add_argument('--seq-len', type=int, default=2048)
    parser.add_argument('--steps', type=int, default=30)
    parser.add_argument('--warmup-steps', type=int, default=5)
    parser.add_argument('--peak-tflops', type=float, default=989.0)
    parser.add_argument('--compile', action='store_true', help='torch.compile the model')
    args = parser.parse_args()

    raw = json.load(open(args.config))
    if args.layers:
        raw['num_hidden_layers'] = args.layers
    config = torch_model.ModelConfig.from_dict(raw)
    torch_model.Attention.attend = sdpa_attend
    device = torch.device('cuda')
    torch.manual_seed(0)
    model = torch_model.CausalLM(config, dtype=torch.float32).to(device)
    torch_model.init_weights(model, config.initializer_range)
    if args.compile:
        model = torch.compile(model)
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1,
                            eps=1e-8, fused=True)
    gen = torch.Generator(device=device).manual_seed(1)
    torch.cuda.reset_peak_memory_stats()
    timed_tokens, start = 0, None
    loss = None
    for step in range(args.steps):
        if step == args.warmup_steps:
            torch.cuda.synchronize()
            start = time.perf_counter()
        tokens = torch.randint(0, config.vocab_size, (args.batch_size, args.seq_len + 1),
                               device=device, generator=gen)
        with torch.autocast('cuda', dtype=torch.bfloat16):
            loss = model.loss(tokens)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step >= args.warmup_steps:
            timed_tokens += args.batch_size * args.seq_len
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    tps = timed_tokens / seconds
    active = params
    if config.moe is not None:  # a token runs top_k of the num_experts routed experts
        moe = config.moe
        active -= config.num_hidden_layers * (moe.num_experts - moe.top_k) * 3 * \
            moe.expert_intermediate_size * config.hidden_size
    flops_per_token = 6 * active + \
        6 * config.num_hidden_layers * args.seq_len * config.hidden_size
    result = {
        'framework': 'pytorch %s eager%s (SDPA)' % (torch.__version__,
                                                   ' + compile' if args.compile else ''),
        'config': os.path.basename(args.config),
        'layers': config.num_hidden_layers,
        'parameters': params,
        'batch': [args.batch_size, args.seq_len],
        'tokens_per_second': tps,
        'mfu': tps * flops_per_token / (args.peak_tflops * 1e12),
        'peak_memory_gib': torch.cuda.max_memory_allocated() / 2**30,
        'final_loss': float(loss),
        'device': torch.cuda.get_device_name(),
    }
    print(json.dumps(result))


if __name__ == '__main__':
    main()
