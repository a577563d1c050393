#!/usr/bin/python3
"""PyTorch eager CPU training baseline for the satdar baseline model.

Trains the model of MODELS.md section 2 (tests/reference/torch_model.py:
tied embeddings, QK-norm, RoPE, GQA, SwiGLU) in float32 on uniformly random
tokens with AdamW (lr 1e-3, betas (0.9, 0.95), weight decay 0.1 on all
parameters, eps 1e-8) and gradient clipping at 1.0, and reports the training
throughput, so `satdar train --synthetic-data` can be compared with idiomatic
PyTorch at the same shape and thread count.

Usage:
    /usr/bin/python3 bench/pytorch_baseline.py --steps 20 --warmup-steps 2 \
        --threads 2 --json /tmp/torch_baseline.json

tokens/s = batch_size * seq_len * (steps - warmup_steps) / elapsed, timed over
the steps after the warm-up. Peak RSS is ru_maxrss of this process.

Needs only torch (Debian's python3-torch 1.13 at /usr/bin/python3).
"""

import argparse
import ctypes
import json
import os
import platform
import resource
import sys
import time
from typing import Dict, List, Optional

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                os.pardir, 'tests', 'reference'))
import torch_model  # pylint: disable=g-import-not-at-top,wrong-import-position

# Optimizer settings (MODELS.md section 7 training defaults, constant lr).
LEARNING_RATE = 1e-3
BETAS = (0.9, 0.95)
WEIGHT_DECAY = 0.1
ADAM_EPS = 1e-8
GRAD_CLIP = 1.0


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split('\n\n', maxsplit=1)[0])
    parser.add_argument('--hidden', type=int, default=384)
    parser.add_argument('--layers', type=int, default=6)
    parser.add_argument('--heads', type=int, default=6)
    parser.add_argument('--kv-heads', type=int, default=None,
                        help='default: --heads')
    parser.add_argument('--ffn', type=int, default=1536)
    parser.add_argument('--vocab', type=int, default=256)
    parser.add_argument('--seq-len', type=int, default=256)
    parser.add_argument('--batch-size', type=int, default=8)
    parser.add_argument('--steps', type=int, default=20,
                        help='total optimizer steps, warm-up included')
    parser.add_argument('--warmup-steps', type=int, default=2,
                        help='leading steps excluded from the timing')
    parser.add_argument('--threads', type=int, default=2)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--json', help='write the summary JSON here')
    args = parser.parse_args(argv)
    if args.warmup_steps < 0 or args.steps <= args.warmup_steps:
        parser.error('need 0 <= --warmup-steps < --steps')
    if args.threads < 1:
        parser.error('--threads must be >= 1')
    return args


def set_threads(threads: int) -> Optional[int]:
    """Limits torch, and the OpenBLAS it may call, to `threads` threads.

    torch.set_num_threads covers OpenMP (and MKL), but Debian's torch calls
    OpenBLAS for matrix products, whose own thread pool is sized to all
    cores and ignores torch's setting; cap it too when it is loaded.

    Args:
        threads: the thread count.

    Returns:
        OpenBLAS's thread count after the call, or None if not in use.
    """
    torch.set_num_threads(threads)
    try:
        openblas = ctypes.CDLL('libopenblas.so.0')
        openblas.openblas_set_num_threads(threads)
        return openblas.openblas_get_num_threads()
    except (OSError, AttributeError):
        return None


def build_model(args: argparse.Namespace) -> torch_model.CausalLM:
    """The float32 baseline model at the flag shape, initialised N(0, 0.02)."""
    config = torch_model.ModelConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.ffn,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=max(args.seq_len, 1),
        tie_word_embeddings=True,
        qk_norm=True)
    model = torch_model.CausalLM(config, dtype=torch.float32)
    generator = torch.Generator().manual_seed(args.seed)
    torch_model.init_weights(model, config.initializer_range, generator)
    return model


def train(args: argparse.Namespace) -> Dict[str, object]:
    """Runs the training loop; returns the summary."""
    openblas_threads = set_threads(args.threads)
    torch.manual_seed(args.seed)
    model = build_model(args)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE,
                                  betas=BETAS, eps=ADAM_EPS,
                                  weight_decay=WEIGHT_DECAY)
    data = torch.Generator().manual_seed(args.seed + 1)
    shape = (args.batch_size, args.seq_len + 1)

    loss_value = float('nan')
    start = None
    for step in range(args.steps):
        if step == args.warmup_steps:
            start = time.perf_counter()
        tokens = torch.randint(0, args.vocab, shape, generator=data)
        optimizer.zero_grad(set_to_none=True)
        loss = model.loss(tokens)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        optimizer.step()
        loss_value = loss.item()
    elapsed = time.perf_counter() - start

    timed_steps = args.steps - args.warmup_steps
    tokens_per_second = (args.batch_size * args.seq_len * timed_steps /
                         elapsed)
    return {
        'tokens_per_second': tokens_per_second,
        'peak_rss_bytes':
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        'steps': args.steps,
        'final_loss': loss_value,
        # Extra context for whoever reads the JSON later.
        'timed_steps': timed_steps,
        'elapsed_seconds': elapsed,
        'threads': args.threads,
        'openblas_threads': openblas_threads,
        'parameters': sum(p.numel() for p in model.parameters()),
        'torch_version': torch.__version__,
        'machine': platform.machine(),
    }


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    summary = train(args)
    print(f'pytorch {summary["torch_version"]} eager fp32: '
          f'd={args.hidden} L={args.layers} H={args.heads} '
          f'N={args.kv_heads or args.heads} dff={args.ffn} V={args.vocab} '
          f'B={args.batch_size} T={args.seq_len} threads={args.threads}: '
          f'{summary["tokens_per_second"]:.1f} tokens/s over '
          f'{summary["timed_steps"]} steps, '
          f'peak RSS {summary["peak_rss_bytes"] / 2**20:.1f} MiB, '
          f'final loss {summary["final_loss"]:.4f}')
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(summary, f, indent=2)
            f.write('\n')
    return 0


if __name__ == '__main__':
    sys.exit(main())
