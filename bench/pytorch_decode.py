#!/usr/bin/python3
"""PyTorch greedy decoding with a KV cache, the baseline of `satdar generate`.

Loads a satdar config JSON and a safetensors weights file (`satdar init`,
`satdar export`, or any writer using the MODELS.md section 5 names) into the
PyTorch reference model (tests/reference/torch_model.py) and decodes greedily
in two ways:

  (a) with a KV cache kept here: the prompt is prefilled once, then each step
      runs only the newest token, its attention reading the cached keys and
      values. The cached attention reuses the reference's own modules (q/k/v/o
      projections, QK-norm, value mixing, attention core, RoPE tables), and
      the rest of the step is the reference's own topology runner, so it is
      the same math on fewer rows;
  (b) without a cache: a full forward over the whole prefix every step, as a
      check.

Every design works: only attention mixes positions (value residuals, residual
topologies and the MoE routing are per token), so (a) caches per layer the
rotated K and the V' attention reads (after the SATFormer/ResFormer mixing,
which for a past token depends on that token only). (a) and (b) must give the
same tokens; float32 may flip a near-tie, so a mismatch reports the first
differing position, and --dtype f64 makes the check exact.

Greedy is argmax with ties to the lowest id; a row stops after emitting
--eos-id (the batch stops when every row has). tokens/s = new tokens of all
rows / (prefill + decode seconds) of the median of --repeats timed runs,
after one untimed warm-up run (the first call of torch's kernels pays one-off
set-up costs).

Usage:
    /usr/bin/python3 bench/pytorch_decode.py --config configs/demo.json \
        --weights /tmp/demo.safetensors --prompt-ids 1,2,3 \
        --max-new-tokens 128 --threads 1 [--batch 1] [--json]

Needs only torch (Debian's python3-torch 1.13 at /usr/bin/python3) and numpy.
"""

import argparse
import dataclasses
import json
import os
import sys
import time
import types
from typing import Dict, List, Optional, Tuple

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(_HERE, os.pardir, 'tests', 'reference'))
# pylint: disable=g-import-not-at-top,wrong-import-position
import pytorch_baseline  # bench/: set_threads (torch and OpenBLAS)
import reference_common  # read_safetensors
import torch_model
import torch_topologies
# pylint: enable=g-import-not-at-top,wrong-import-position

DTYPES = {'f32': torch.float32, 'f64': torch.float64}


@dataclasses.dataclass
class DecodeState(torch_model.ForwardState):
    """ForwardState of a cached step: tn new rows at positions past.. .

    cos/sin hold the RoPE rows of the new positions and mask is [tn, past+tn]
    (query i sees keys j <= past + i). caches: layer index -> (K, V'), each
    [B, N, capacity, dh], rows [0, past) filled by earlier steps.
    """
    past: int = 0
    caches: Dict[int, Tuple[torch.Tensor, torch.Tensor]] = dataclasses.field(
        default_factory=dict)


def _cached_attention(attn: torch_model.Attention, x: torch.Tensor,
                      state: torch_model.ForwardState,
                      x_k: Optional[torch.Tensor] = None,
                      x_v: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Attention.forward over a KV cache when state is a DecodeState.

    The same steps as Attention.forward (it is the fallback) on the new rows;
    the rotated K and the V' attention reads go to the layer's cache, and the
    queries attend over every cached position.
    """
    if not isinstance(state, DecodeState):
        return torch_model.Attention.forward(attn, x, state, x_k, x_v)
    x_k = x if x_k is None else x_k
    x_v = x if x_v is None else x_v
    b, t, _ = x.shape
    h, n, dh = attn.num_heads, attn.num_kv_heads, attn.head_dim
    q = attn.q_proj(x).view(b, t, h, dh)
    k = attn.k_proj(x_k).view(b, t, n, dh)
    v = attn.mix_values(attn.v_proj(x_v).view(b, t, n, dh), x_v, state)
    if attn.q_norm is not None:
        q = attn.q_norm(q)
        k = attn.k_norm(k)
    q = torch_model.apply_rope(q.transpose(1, 2), state.cos, state.sin)
    k = torch_model.apply_rope(k.transpose(1, 2), state.cos, state.sin)
    k_cache, v_cache = state.caches[attn.layer_index]
    end = state.past + t
    k_cache[:, :, state.past:end] = k
    v_cache[:, :, state.past:end] = v.transpose(1, 2)
    return attn.o_proj(attn.attend(q, k_cache[:, :, :end],
                                   v_cache[:, :, :end], state))


def load_config(path: str) -> torch_model.ModelConfig:
    """The reference config of a satdar config JSON.

    satdar lets an MoE config leave intermediate_size out (or 0): its experts
    have their own width. The reference wants one, so such a config gets 1,
    which nothing reads.
    """
    with open(path) as f:
        raw = json.load(f)
    if raw.get('moe') and not raw.get('intermediate_size'):
        raw['intermediate_size'] = 1
    return torch_model.ModelConfig.from_dict(raw)


def load_model(config_path: str, weights_path: str,
               dtype: torch.dtype) -> torch_model.CausalLM:
    """The reference model holding the file's weights (every name, no more).

    Raises:
        ValueError: the config is invalid, or the file is malformed or does
            not hold exactly the model's tensors with their shapes.
    """
    config = load_config(config_path)
    weights, _ = reference_common.read_safetensors(weights_path)
    model = torch_model.CausalLM(config, dtype=dtype)
    expected = {name: tuple(p.shape) for name, p in model.named_parameters()}
    missing = sorted(set(expected) - set(weights))
    extra = sorted(set(weights) - set(expected))
    if missing or extra:
        raise ValueError(f'{weights_path}: missing {missing[:5]}'
                         f'{"..." if len(missing) > 5 else ""}, unexpected '
                         f'{extra[:5]}{"..." if len(extra) > 5 else ""}')
    for name, shape in expected.items():
        if tuple(weights[name].shape) != shape:
            raise ValueError(f'{weights_path}: {name} has shape '
                             f'{list(weights[name].shape)}, the config asks '
                             f'for {list(shape)}')
    model.load_state_dict({k: v.to(dtype) for k, v in weights.items()},
                          strict=True)
    model.eval()
    for module in model.modules():
        if isinstance(module, torch_model.Attention):
            module.forward = types.MethodType(_cached_attention, module)
    return model


class KvDecoder:
    """Greedy decoding of a CausalLM over a KV cache of `capacity` rows."""

    def __init__(self, model: torch_model.CausalLM, batch: int,
                 capacity: int):
        config = model.config
        if capacity > config.max_position_embeddings:
            raise ValueError(f'prompt + new tokens = {capacity} exceeds '
                             'max_position_embeddings '
                             f'{config.max_position_embeddings}')
        self.model = model
        dtype = model.model.embed_tokens.weight.dtype
        # Tables for every position once; a step takes its rows (the same
        # values as the full-prefix tables, which depend on position only).
        self.cos, self.sin = torch_model.rope_tables(
            capacity, config.head_dim, config.rope_theta, dtype)
        shape = (batch, config.num_key_value_heads, capacity, config.head_dim)
        self.caches = {i: (torch.empty(shape, dtype=dtype),
                           torch.empty(shape, dtype=dtype))
                       for i in range(config.num_hidden_layers)}
        self.past = 0
        self.dtype = dtype

    def step(self, ids: torch.Tensor) -> torch.Tensor:
        """Runs [B, tn] new ids; returns the last position's logits [B, V]."""
        backbone = self.model.model
        t = ids.shape[1]
        end = self.past + t
        mask = torch.triu(torch.full((t, end), float('-inf'),
                                     dtype=self.dtype),
                          diagonal=self.past + 1)
        state = DecodeState(cos=self.cos[self.past:end],
                            sin=self.sin[self.past:end], mask=mask,
                            past=self.past, caches=self.caches)
        if backbone.value_residual is not None:
            state.lambda1 = backbone.value_residual()
        h = backbone.embed_tokens(ids)
        h = torch_topologies.run_topology(backbone.config, backbone, h, state)
        last = backbone.norm(h[:, -1])
        self.past = end
        return torch.matmul(last, self.model.output_weight().t())


def _finish(next_ids: torch.Tensor, rows: List[List[int]],
            done: List[bool], eos_id: int) -> None:
    """Appends each unfinished row's token; marks rows that emitted eos."""
    for r, token in enumerate(next_ids.tolist()):
        if not done[r]:
            rows[r].append(token)
            done[r] = token == eos_id


@torch.inference_mode()
def decode_cached(model: torch_model.CausalLM, prompt: torch.Tensor,
                  max_new_tokens: int, eos_id: int
                  ) -> Tuple[List[List[int]], float, float]:
    """(a): greedy with the KV cache; (ids per row, prefill s, total s)."""
    start = time.perf_counter()
    decoder = KvDecoder(model, prompt.shape[0],
                        prompt.shape[1] + max_new_tokens)
    rows = [[] for _ in range(prompt.shape[0])]
    done = [False] * prompt.shape[0]
    logits = decoder.step(prompt)
    prefill = time.perf_counter() - start
    for i in range(max_new_tokens):
        next_ids = torch.argmax(logits, dim=-1)
        _finish(next_ids, rows, done, eos_id)
        if all(done) or i + 1 == max_new_tokens:
            break
        logits = decoder.step(next_ids.unsqueeze(1))
    return rows, prefill, time.perf_counter() - start


@torch.inference_mode()
def decode_uncached(model: torch_model.CausalLM, prompt: torch.Tensor,
                    max_new_tokens: int, eos_id: int
                    ) -> Tuple[List[List[int]], float]:
    """(b): greedy by a full forward over the prefix; (ids per row, s)."""
    start = time.perf_counter()
    rows = [[] for _ in range(prompt.shape[0])]
    done = [False] * prompt.shape[0]
    prefix = prompt
    for _ in range(max_new_tokens):
        next_ids = torch.argmax(model(prefix)[:, -1], dim=-1)
        _finish(next_ids, rows, done, eos_id)
        if all(done):
            break
        prefix = torch.cat((prefix, next_ids.unsqueeze(1)), dim=1)
    return rows, time.perf_counter() - start


def first_divergence(a: List[List[int]], b: List[List[int]]
                     ) -> Optional[int]:
    """First position where some row of a and b differ (a length
    difference counts at the shorter length); None if they are equal."""
    first = None
    for x, y in zip(a, b):
        for i in range(max(len(x), len(y))):
            if i >= len(x) or i >= len(y) or x[i] != y[i]:
                first = i if first is None else min(first, i)
                break
    return first


def parse_ids(text: str) -> List[int]:
    try:
        ids = [int(s) for s in text.split(',') if s.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f'bad id list {text!r}') from e
    if not ids:
        raise argparse.ArgumentTypeError('empty prompt')
    return ids


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split('\n\n', maxsplit=1)[0])
    parser.add_argument('--config', required=True, help='satdar config JSON')
    parser.add_argument('--weights', required=True,
                        help='safetensors weights (F32, F64 or BF16)')
    parser.add_argument('--prompt-ids', type=parse_ids, required=True,
                        help='comma-separated prompt token ids')
    parser.add_argument('--max-new-tokens', type=int, default=128)
    parser.add_argument('--threads', type=int, default=1)
    parser.add_argument('--batch', type=int, default=1,
                        help='rows decoded together, each with the prompt')
    parser.add_argument('--eos-id', type=int, default=2,
                        help='a row stops after emitting it (-1: never)')
    parser.add_argument('--dtype', choices=sorted(DTYPES), default='f32')
    parser.add_argument('--warmup', type=int, default=1,
                        help='untimed runs of (a) before the timed one')
    parser.add_argument('--repeats', type=int, default=3,
                        help='timed runs of (a); the median one counts')
    parser.add_argument('--no-check', action='store_true',
                        help='skip (b), the uncached decode')
    parser.add_argument('--json', action='store_true',
                        help='print one JSON line instead of text')
    args = parser.parse_args(argv)
    if args.max_new_tokens < 1 or args.threads < 1 or args.batch < 1:
        parser.error('--max-new-tokens, --threads and --batch must be >= 1')
    if args.warmup < 0 or args.repeats < 1:
        parser.error('need --warmup >= 0 and --repeats >= 1')
    return args


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    pytorch_baseline.set_threads(args.threads)
    try:
        model = load_model(args.config, args.weights, DTYPES[args.dtype])
    except (OSError, ValueError) as e:
        print(f'pytorch_decode: {e}', file=sys.stderr)
        return 2
    vocab = model.config.vocab_size
    if not all(0 <= i < vocab for i in args.prompt_ids):
        print(f'pytorch_decode: prompt ids must be in [0, {vocab})',
              file=sys.stderr)
        return 2
    prompt = torch.tensor([args.prompt_ids] * args.batch, dtype=torch.int64)
    try:
        for _ in range(args.warmup):
            decode_cached(model, prompt, min(args.max_new_tokens, 8),
                          args.eos_id)
        runs = [decode_cached(model, prompt, args.max_new_tokens,
                              args.eos_id) for _ in range(args.repeats)]
        rows, prefill, seconds = sorted(runs, key=lambda r: r[2])[
            (args.repeats - 1) // 2]
    except ValueError as e:
        print(f'pytorch_decode: {e}', file=sys.stderr)
        return 2
    new_tokens = sum(len(r) for r in rows)
    result = {
        'ids': rows[0],
        'tokens_per_s': new_tokens / seconds,
        'new_tokens': new_tokens,
        'seconds': seconds,
        'prefill_seconds': prefill,
        'decode_tokens_per_s': (
            (new_tokens - args.batch) / (seconds - prefill)
            if new_tokens > args.batch else None),
        'batch': args.batch,
        'threads': args.threads,
        'dtype': args.dtype,
        'torch_version': torch.__version__,
    }
    if args.batch > 1:
        result['all_ids'] = rows
    status = 0
    if not args.no_check:
        check_rows, check_seconds = decode_uncached(
            model, prompt, args.max_new_tokens, args.eos_id)
        divergence = first_divergence(rows, check_rows)
        result['nocache_tokens_per_s'] = (
            sum(len(r) for r in check_rows) / check_seconds)
        result['nocache_ids'] = check_rows[0]
        result['match'] = divergence is None
        result['first_divergence'] = divergence
        # A float32 near-tie may flip late; the very first token must agree.
        if divergence == 0:
            status = 1
    if args.json:
        print(json.dumps(result))
    else:
        print(f'pytorch {torch.__version__} {args.dtype} '
              f'{os.path.basename(args.config)} B={args.batch} '
              f'prompt={len(args.prompt_ids)} threads={args.threads}: '
              f'(a) KV cache {result["tokens_per_s"]:.1f} tokens/s '
              f'({new_tokens} tokens in {seconds:.3f} s, prefill '
              f'{prefill * 1e3:.1f} ms)')
        if not args.no_check:
            same = ('same tokens' if result['match'] else
                    f'FIRST DIVERGENCE at {result["first_divergence"]}')
            print(f'(b) no cache {result["nocache_tokens_per_s"]:.1f} '
                  f'tokens/s; (a) vs (b): {same}')
        print('ids: ' + ','.join(map(str, rows[0])))
    return status


if __name__ == '__main__':
    sys.exit(main())
