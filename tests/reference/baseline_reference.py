#!/usr/bin/python3
"""Checks `satdar grad` against an independent PyTorch reference.

For a few small baseline configs (MODELS.md section 2) this script writes a
config JSON, random float64 weights and a random token batch to --workdir,
runs `satdar grad` in f64 and f32, and compares the loss and every gradient
with torch autograd in float64 (tests/reference/torch_model.py).

A case (config, dtype) passes when, for the loss and for every gradient,

    max|satdar - ref| / max(max|ref|, 1e-30) <= 1e-9 (f64) or 1e-4 (f32)

and the output holds exactly `loss` plus `grad.<name>` for every weight, in
the requested dtype and with the weight's shape.

Usage:
    /usr/bin/python3 baseline_reference.py --satdar bazel-bin/satdar \
        --workdir /tmp/ref
    /usr/bin/python3 baseline_reference.py --self-test

The last line printed is `N passed, M failed`; the exit status is 1 if any
case failed, else 0. --self-test checks the reference itself (safetensors
round trip, loss at uniform logits, an independent loop implementation, RoPE
and causality properties, and the comparison plumbing against a fake satdar
built from this reference) without needing the satdar binary.

Needs only torch and numpy (Debian's python3-torch 1.13 at /usr/bin/python3).
"""

import collections
import contextlib
import dataclasses
import io
import math
import os
import struct
import sys
from typing import Callable, Dict, List, Mapping, Optional, Tuple

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# pylint: disable=g-import-not-at-top,wrong-import-position
import reference_common as common
import torch_model
# pylint: enable=g-import-not-at-top,wrong-import-position

# Batch shape of every case: tokens are [BATCH, SEQ_LEN + 1].
BATCH = 3
SEQ_LEN = 7

# Random weights: matrices N(0, MATRIX_STD), norm gains 1 + GAIN_STD * N(0, 1).
# Much larger than the 0.02 init, so that every gradient is far from zero.
MATRIX_STD = 0.3
GAIN_STD = 0.2

# ---------------------------------------------------------------------------
# Cases and reference computation
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class Case:
    """One model config to check.

    Attributes:
        name: short identifier, used in file names and the report.
        config: the config JSON object (MODELS.md section 1 fields).
        token_dtype: dtype of the token tensor written for satdar.
        seed: seed of the weights and tokens.
    """
    name: str
    config: Dict[str, object]
    token_dtype: torch.dtype
    seed: int


def _config(vocab, hidden, ffn, layers, heads, kv_heads, tied, qk_norm,
            rope_theta=1e4, eps=1e-6):
    """Returns a baseline config JSON object."""
    return {
        'vocab_size': vocab,
        'hidden_size': hidden,
        'intermediate_size': ffn,
        'num_hidden_layers': layers,
        'num_attention_heads': heads,
        'num_key_value_heads': kv_heads,
        'tie_word_embeddings': tied,
        'qk_norm': qk_norm,
        'rope_theta': rope_theta,
        'rms_norm_eps': eps,
        'max_position_embeddings': 64,
    }


CASES = (
    # Tied embeddings, QK-norm, GQA with two query heads per KV head.
    Case('a_tied_qknorm_gqa',
         _config(vocab=50, hidden=32, ffn=48, layers=2, heads=4, kv_heads=2,
                 tied=True, qk_norm=True),
         torch.int64, seed=1001),
    # Separate LM head, no QK-norm, plain MHA, non-default RoPE base.
    Case('b_untied_mha',
         _config(vocab=37, hidden=16, ffn=40, layers=3, heads=2, kv_heads=2,
                 tied=False, qk_norm=False, rope_theta=500.0),
         torch.int32, seed=1002),
    # Tied, QK-norm, multi-query attention with an odd head count.
    Case('c_tied_qknorm_mqa',
         _config(vocab=64, hidden=24, ffn=20, layers=1, heads=3, kv_heads=1,
                 tied=True, qk_norm=True, eps=1e-5),
         torch.int32, seed=1003),
    # Untied, QK-norm, GQA with three query heads per KV head.
    Case('d_untied_qknorm_gqa3',
         _config(vocab=29, hidden=24, ffn=36, layers=2, heads=6, kv_heads=2,
                 tied=False, qk_norm=True, rope_theta=1e6),
         torch.int64, seed=1004),
)



def random_weights(config: torch_model.ModelConfig,
                   seed: int) -> Dict[str, torch.Tensor]:
    """Float64 test weights: matrices N(0, 0.3), gains 1 + 0.2 N(0, 1).

    Drawn from one torch.Generator in named_parameters() order, so the result
    is a pure function of (config, seed).

    Args:
        config: the model config.
        seed: generator seed.

    Returns:
        Section 5 name -> tensor, in named_parameters() order.
    """
    return common.draw_weights(config, seed, MATRIX_STD, GAIN_STD)


def random_tokens(vocab_size: int, seed: int,
                  dtype: torch.dtype) -> torch.Tensor:
    """Uniform random ids in [0, vocab_size), [BATCH, SEQ_LEN + 1]."""
    return common.random_tokens(vocab_size, seed, dtype, BATCH, SEQ_LEN)


def reference_grads(config: torch_model.ModelConfig,
                    weights: Mapping[str, torch.Tensor],
                    tokens: torch.Tensor,
                    dtype: torch.dtype = torch.float64
                    ) -> Dict[str, torch.Tensor]:
    """Loss and gradients by torch autograd, named like `satdar grad` output.

    Args:
        config: the model config.
        weights: section 5 name -> tensor (any float dtype).
        tokens: [B, T+1] integer ids.
        dtype: precision of the computation.

    Returns:
        `loss` ([1]) and `grad.<name>` for every weight, all of dtype.
    """
    return common.autograd_grads(config, weights, tokens, dtype)


def naive_loss(config: torch_model.ModelConfig,
               weights: Mapping[str, torch.Tensor],
               tokens: torch.Tensor) -> float:
    """The baseline loss by explicit loops over sequences, positions, heads.

    A second implementation, written straight from MODELS.md section 2 and
    sharing no code with torch_model, used by --self-test to check it. Slow:
    only for tiny configs.

    Args:
        config: the model config.
        weights: section 5 name -> float64 tensor.
        tokens: [B, T+1] integer ids.

    Returns:
        The mean next-token cross-entropy.
    """
    d, eps = config.hidden_size, config.rms_norm_eps
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    dh = d // heads
    half = dh // 2
    group = heads // kv_heads
    w = {k: v.double() for k, v in weights.items()}
    embed = w['model.embed_tokens.weight']
    lm_head = embed if config.tie_word_embeddings else w['lm_head.weight']

    def norm(x, gain):
        return gain * x / math.sqrt(float((x * x).mean()) + eps)

    def rope(x, position):
        out = x.clone()
        for i in range(half):
            angle = position * config.rope_theta ** (-2.0 * i / dh)
            c, s = math.cos(angle), math.sin(angle)
            out[i] = x[i] * c - x[i + half] * s
            out[i + half] = x[i + half] * c + x[i] * s
        return out

    total, count = 0.0, 0
    for row in tokens.tolist():
        inputs, targets = row[:-1], row[1:]
        seq = len(inputs)
        hidden = [embed[token].clone() for token in inputs]
        for layer in range(config.num_hidden_layers):
            p = f'model.layers.{layer}.'
            xs = [norm(h, w[p + 'input_layernorm.weight']) for h in hidden]
            q = [w[p + 'self_attn.q_proj.weight'] @ x for x in xs]
            k = [w[p + 'self_attn.k_proj.weight'] @ x for x in xs]
            v = [w[p + 'self_attn.v_proj.weight'] @ x for x in xs]

            def head_vec(vecs, t, j, kind):
                vec = vecs[t][j * dh:(j + 1) * dh]
                if config.qk_norm and kind != 'v':
                    vec = norm(vec, w[p + f'self_attn.{kind}_norm.weight'])
                return rope(vec, t) if kind != 'v' else vec

            for t in range(seq):
                outs = []
                for j in range(heads):
                    g = j // group
                    qv = head_vec(q, t, j, 'q')
                    scores = [float(qv @ head_vec(k, u, g, 'k')) /
                              math.sqrt(dh) for u in range(t + 1)]
                    top = max(scores)
                    exps = [math.exp(s - top) for s in scores]
                    z = sum(exps)
                    outs.append(sum(e / z * head_vec(v, u, g, 'v')
                                    for u, e in enumerate(exps)))
                attn = w[p + 'self_attn.o_proj.weight'] @ torch.cat(outs)
                hidden[t] = hidden[t] + attn
            for t in range(seq):
                z = norm(hidden[t], w[p + 'post_attention_layernorm.weight'])
                gate = w[p + 'mlp.gate_proj.weight'] @ z
                up = w[p + 'mlp.up_proj.weight'] @ z
                silu = gate / (1.0 + torch.exp(-gate))
                hidden[t] = hidden[t] + w[p + 'mlp.down_proj.weight'] @ (
                    silu * up)
        for t in range(seq):
            final = norm(hidden[t], w['model.norm.weight'])
            logits = (lm_head @ final).tolist()
            top = max(logits)
            log_z = top + math.log(sum(math.exp(x - top) for x in logits))
            total += log_z - logits[targets[t]]
            count += 1
    return total / count


# ---------------------------------------------------------------------------
# Running satdar and comparing
# ---------------------------------------------------------------------------


def write_case(case: Case, workdir: str) -> common.CaseFiles:
    """Writes the config, weights and tokens of a case; returns the paths."""
    config = torch_model.ModelConfig.from_dict(case.config)
    return common.write_case_files(
        case.name, case.config, random_weights(config, case.seed),
        random_tokens(config.vocab_size, case.seed + 7919, case.token_dtype),
        workdir)


def check_case(case: Case, satdar: str, workdir: str, threads: int,
               timeout: float) -> List[bool]:
    """Runs one case in every dtype, prints a line each; returns pass flags."""
    files = write_case(case, workdir)
    config, weights, tokens = common.load_case(files)
    expected = reference_grads(config, weights, tokens)
    return common.check_outputs(
        case.name, files, expected,
        common.satdar_runner(satdar, threads, timeout), workdir)


# ---------------------------------------------------------------------------
# Self-test (no satdar needed)
# ---------------------------------------------------------------------------


def fake_satdar_main(argv: List[str], mode: str = 'exact') -> int:
    """A stand-in for `satdar grad` built on the reference, for --self-test.

    Computes in the requested precision (so its f32 output shows that f32
    arithmetic meets the f32 tolerance). mode 'perturb' spoils one gradient,
    'missing' drops one, 'extra' adds one, to check that they are caught.

    Args:
        argv: the command line after the program name.
        mode: 'exact', 'perturb', 'missing' or 'extra'.

    Returns:
        The process exit status.
    """
    def grads_for(files: common.CaseFiles,
                  dtype: str) -> Dict[str, torch.Tensor]:
        config, weights, tokens = common.load_case(files)
        grads = reference_grads(config, weights, tokens,
                                dtype=common.OUTPUT_DTYPES[dtype])
        victim = 'grad.model.norm.weight'
        if mode == 'perturb':
            grads[victim] = grads[victim] * (1 + 1e-3)
        elif mode == 'missing':
            del grads[victim]
        elif mode == 'extra':
            grads['grad.model.bogus'] = torch.zeros(
                1, dtype=grads['loss'].dtype)
        return grads

    return common.fake_satdar_main(argv, grads_for)


def _write_fake_satdar(directory: str, mode: str) -> str:
    """Writes an executable wrapper running fake_satdar_main; returns path."""
    return common.write_fake_satdar(
        os.path.join(directory, f'fake_satdar_{mode}'), 'baseline_reference',
        mode)


def _check_safetensors_round_trip(workdir: str) -> str:
    generator = torch.Generator().manual_seed(5)
    tensors = collections.OrderedDict(
        f64=torch.randn(3, 5, dtype=torch.float64, generator=generator),
        f32=torch.randn(7, dtype=torch.float32, generator=generator),
        i64=torch.tensor([[-(2**40), 3], [2**62, 0]], dtype=torch.int64),
        i32=torch.tensor([1, -2, 2**31 - 1], dtype=torch.int32),
        scalar=torch.tensor(2.5, dtype=torch.float64),
        f16=torch.tensor([0.5, -65504.0], dtype=torch.float16),
        bf16=torch.tensor([1.0, -3.0e38, 2.0**-130], dtype=torch.bfloat16),
        empty=torch.zeros(0, 4, dtype=torch.float32))
    path = os.path.join(workdir, 'round_trip.safetensors')
    common.write_safetensors(path, tensors,
                             metadata={'format': 'pt', 'k': 'v'})
    back, metadata = common.read_safetensors(path)
    assert metadata == {'format': 'pt', 'k': 'v'}, metadata
    assert list(back) == list(tensors), list(back)
    for name, tensor in tensors.items():
        assert back[name].dtype == tensor.dtype, name
        assert back[name].shape == tensor.shape, name
        assert torch.equal(back[name], tensor), name
    with open(path, 'rb') as f:
        raw = f.read()
    (header_len,) = struct.unpack('<Q', raw[:8])
    assert header_len % 8 == 0, header_len
    data_len = len(raw) - 8 - header_len
    assert data_len == sum(t.numel() * t.element_size()
                           for t in tensors.values())
    # Malformed files are rejected.
    bad = os.path.join(workdir, 'bad.safetensors')
    corruptions = {
        'truncated data': raw[:-3],
        'truncated header': raw[:8 + header_len // 2],
        'no header length': raw[:5],
        'unknown dtype': raw.replace(b'"I32"', b'"Q32"'),
    }
    for what, content in corruptions.items():
        with open(bad, 'wb') as f:
            f.write(content)
        try:
            common.read_safetensors(bad)
        except ValueError:
            continue
        raise AssertionError(f'{what} not rejected')
    return f'{len(tensors)} tensors, header {header_len} bytes'


def _check_uniform_logits_loss(_: str) -> str:
    # Untied, LM head zero: every logit is 0, so the loss is exactly log V.
    config = torch_model.ModelConfig.from_dict(CASES[1].config)
    weights = random_weights(config, seed=11)
    weights['lm_head.weight'].zero_()
    tokens = random_tokens(config.vocab_size, 12, torch.int64)
    grads = reference_grads(config, weights, tokens)
    loss = float(grads['loss'])
    assert abs(loss - math.log(config.vocab_size)) < 1e-12, loss
    # Tied, standard 0.02 init: logits are tiny, so the loss is near log V.
    config = torch_model.ModelConfig.from_dict(CASES[0].config)
    model = torch_model.CausalLM(config, dtype=torch.float64)
    torch_model.init_weights(model, 0.02, torch.Generator().manual_seed(13))
    tokens = random_tokens(config.vocab_size, 14, torch.int32)
    init_loss = float(model.loss(tokens))
    assert abs(init_loss - math.log(config.vocab_size)) < 0.05, init_loss
    return (f'zero head {loss:.6f} = log {CASES[1].config["vocab_size"]}; '
            f'0.02 init {init_loss:.4f} vs log V '
            f'{math.log(config.vocab_size):.4f}')


def _check_naive_implementation(_: str) -> str:
    worst = 0.0
    for case in CASES:
        config = torch_model.ModelConfig.from_dict(case.config)
        weights = random_weights(config, case.seed)
        tokens = random_tokens(config.vocab_size, case.seed + 7919,
                               case.token_dtype)
        fast = float(reference_grads(config, weights, tokens)['loss'])
        slow = naive_loss(config, weights, tokens)
        err = abs(fast - slow) / abs(slow)
        assert err < 1e-12, (case.name, fast, slow)
        worst = max(worst, err)
    return f'{len(CASES)} configs, worst relative loss difference {worst:.1e}'


def _check_gradients_nontrivial(_: str) -> str:
    smallest = math.inf
    for case in CASES:
        config = torch_model.ModelConfig.from_dict(case.config)
        grads = reference_grads(config, random_weights(config, case.seed),
                                random_tokens(config.vocab_size, case.seed,
                                              case.token_dtype))
        for name, grad in grads.items():
            scale = float(grad.abs().max())
            assert math.isfinite(scale), name
            if name != 'loss':
                smallest = min(smallest, scale)
    assert smallest > 1e-4, smallest
    return f'smallest max|grad| over all tensors {smallest:.2e}'


def _check_finite_differences(_: str) -> str:
    """Autograd gradients (and their names) agree with central differences."""
    checked, worst = 0, 0.0
    for case in CASES[1:3]:  # One untied, one tied config.
        config = torch_model.ModelConfig.from_dict(case.config)
        weights = random_weights(config, case.seed)
        tokens = random_tokens(config.vocab_size, case.seed, case.token_dtype)
        grads = reference_grads(config, weights, tokens)
        model = torch_model.CausalLM(config, dtype=torch.float64)
        model.load_state_dict(weights)
        params = dict(model.named_parameters())
        picker = torch.Generator().manual_seed(case.seed)
        step = 1e-5
        for name, param in params.items():
            flat = param.data.view(-1)
            for _ in range(3):
                i = int(torch.randint(flat.numel(), (1,), generator=picker))
                saved = float(flat[i])
                with torch.no_grad():
                    flat[i] = saved + step
                    up = float(model.loss(tokens))
                    flat[i] = saved - step
                    down = float(model.loss(tokens))
                    flat[i] = saved
                numeric = (up - down) / (2 * step)
                analytic = float(grads['grad.' + name].view(-1)[i])
                err = abs(numeric - analytic) / max(abs(analytic), 1e-3)
                assert err < 1e-5, (case.name, name, i, numeric, analytic)
                worst = max(worst, err)
                checked += 1
    return f'{checked} entries, worst relative difference {worst:.1e}'


def _check_causality(_: str) -> str:
    config = torch_model.ModelConfig.from_dict(CASES[0].config)
    model = torch_model.CausalLM(config, dtype=torch.float64)
    model.load_state_dict(random_weights(config, 21))
    tokens = random_tokens(config.vocab_size, 22, torch.int64)[:, :-1]
    changed = tokens.clone()
    changed[:, 4] = (changed[:, 4] + 1) % config.vocab_size
    with torch.no_grad():
        before, after = model(tokens), model(changed)
    assert torch.equal(before[:, :4], after[:, :4])
    assert (before[:, 4:] - after[:, 4:]).abs().amax(dim=-1).min() > 1e-6
    return 'positions < 4 unchanged, positions >= 4 changed'


def _check_rope(_: str) -> str:
    dh, theta = 8, 500.0
    generator = torch.Generator().manual_seed(31)
    q = torch.randn(dh, dtype=torch.float64, generator=generator)
    k = torch.randn(dh, dtype=torch.float64, generator=generator)
    cos, sin = torch_model.rope_tables(20, dh, theta, torch.float64)

    def rot(x, t):
        return torch_model.apply_rope(x, cos[t], sin[t])

    # Rotations keep norms and make q.k depend on relative position only.
    assert abs(float(rot(q, 13).norm() - q.norm())) < 1e-12
    base = float(rot(q, 5) @ rot(k, 2))
    shifted = float(rot(q, 17) @ rot(k, 14))
    assert abs(base - shifted) < 1e-12, (base, shifted)
    # Pairs are (i, i + dh/2), rotated by t * theta^(-2i/dh).
    x = torch.zeros(dh, dtype=torch.float64)
    x[1] = 1.0
    angle = 3 * theta ** (-2.0 / dh)
    expected = torch.zeros(dh, dtype=torch.float64)
    expected[1], expected[1 + dh // 2] = math.cos(angle), math.sin(angle)
    assert torch.allclose(rot(x, 3), expected, atol=1e-15, rtol=0)
    return 'norm kept, relative positions only, HF pair layout'


def _check_against_fake_satdar(workdir: str) -> str:
    """The full check passes a faithful satdar and fails broken ones."""
    outcomes = {}
    log = io.StringIO()  # The per-case report, shown only on failure.
    for mode in ('exact', 'perturb', 'missing', 'extra'):
        satdar = _write_fake_satdar(workdir, mode)
        flags = []
        with contextlib.redirect_stdout(log):
            print(f'--- fake satdar, mode {mode}')
            # Every case for the faithful fake; one for each broken one.
            for case in CASES if mode == 'exact' else CASES[:1]:
                flags += check_case(case, satdar, workdir, threads=1,
                                    timeout=600)
        outcomes[mode] = flags
    expected = {'exact': True, 'perturb': False, 'missing': False,
                'extra': False}
    for mode, flags in outcomes.items():
        if flags != [expected[mode]] * len(flags):
            raise AssertionError(f'mode {mode}: outcomes {flags}\n'
                                 f'{log.getvalue()}')
    return 'faithful fake passes every case; broken fakes fail'


SELF_TESTS: Tuple[Tuple[str, Callable[[str], str]], ...] = (
    ('safetensors round trip', _check_safetensors_round_trip),
    ('loss at uniform logits', _check_uniform_logits_loss),
    ('matches loop implementation', _check_naive_implementation),
    ('gradients finite and large', _check_gradients_nontrivial),
    ('gradients match finite differences', _check_finite_differences),
    ('causal', _check_causality),
    ('rope', _check_rope),
    ('comparison vs fake satdar', _check_against_fake_satdar),
)



def run_self_test(workdir: str) -> Tuple[int, int]:
    """Runs SELF_TESTS, printing a line each; returns (passed, failed)."""
    return common.run_self_tests(SELF_TESTS, workdir)


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------


def main(argv: Optional[List[str]] = None) -> int:
    parser = common.argument_parser(__doc__)
    args = parser.parse_args(argv)
    if not args.self_test and not (args.satdar and args.workdir):
        parser.error('--satdar and --workdir are required (or --self-test)')
    torch.set_num_threads(max(1, args.threads))

    def run(workdir: str) -> Tuple[int, int]:
        if args.self_test:
            return run_self_test(workdir)
        satdar = os.path.abspath(args.satdar)
        outcomes = []
        for case in CASES:
            outcomes += check_case(case, satdar, workdir, args.threads,
                                   args.timeout)
        return common.tally(outcomes)

    return common.run_driver(args.workdir, 'satdar_ref_', run)


if __name__ == '__main__':
    sys.exit(main())
