#!/usr/bin/python3
"""Checks `satdar grad` against the PyTorch reference on every model design.

For small configs of every design (value residuals, residual topologies, MoE
and compositions of them; see CASES) this script writes a config JSON,
random float64 weights and a token batch to --workdir, runs `satdar grad` in
f64 and f32, and compares the loss and every gradient with torch autograd in
float64 (tests/reference/torch_model.py and the modules it uses).

A case (config, dtype) passes when, for the loss and for every gradient,

    max|satdar - ref| / max(max|ref|, 1e-30) <= 1e-9 (f64) or 1e-4 (f32)

and the output holds exactly `loss` plus `grad.<name>` for every weight, in
the requested dtype and with the weight's shape.

A gradient that is zero by construction (the retrieval query, key norm
and stream mix of the first sublayer, which sees h_0 only; the transport of
a block's first sublayer; layer 0's ResFormer lambda2) comes out of float
arithmetic as exact 0 or as rounding noise, in satdar as in PyTorch. The
reference sets every gradient tensor with max|ref| <= 1e-10 * G to exact
zero, where G is the largest max|ref| over all gradient tensors, and for
those tensors the error is max|satdar| / G instead.

The random weights are redrawn (a pure function of the case seed) until

  * they keep clear of the points where the loss is not differentiable:
    every SATFormer gate logit has |logit| > 1e-3 and, with MoE, every
    token's k-th and (k+1)-th router probabilities differ by more than 1e-3
    relative (so no ties either); and
  * the case is well conditioned in float32: PyTorch's own float32 loss and
    gradients, computed twice (batch in order and reversed), are within a
    tenth of the f32 tolerance by the measure above. Gradients of the small
    mixing tensors ([1], [2]: transport, mix, beta_scale, ...) are sums over
    every token with much cancellation, and some draws make them too
    ill-conditioned for any float32 implementation to reach 1e-4.

Usage:
    /usr/bin/python3 designs_reference.py --satdar bazel-bin/satdar \
        --workdir /tmp/ref [--threads 2] [--only NAME_SUBSTRING]
    /usr/bin/python3 designs_reference.py --list
    /usr/bin/python3 designs_reference.py --self-test

Each case and dtype prints `PASS|FAIL case dtype: worst NAME rel_err X`; the
last line is `N passed, M failed` and the exit status is 1 if any failed.
--self-test checks the reference itself (designs_self_test.py) without the
satdar binary.

Needs only torch and numpy (Debian's python3-torch 1.13 at /usr/bin/python3).
"""

import argparse
import collections
import dataclasses
import json
import math
import os
import sys
from typing import Dict, List, Mapping, Optional, Tuple

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# pylint: disable=g-import-not-at-top,wrong-import-position
import reference_common as common
import torch_model
# pylint: enable=g-import-not-at-top,wrong-import-position

# Batch shape of every case: tokens are [BATCH, SEQ_LEN + 1].
BATCH = 2
SEQ_LEN = 7

# Random weights: matrices N(0, MATRIX_STD), norm gains 1 + GAIN_STD N(0, 1),
# mixing parameters their documented init + MIXING_STD N(0, 1) (times a
# per-parameter factor, see torch_layers.MixingModule.NOISE_SCALE).
MATRIX_STD = 0.3
GAIN_STD = 0.2
MIXING_STD = 0.3

# Non-differentiable points to keep clear of (see the module docstring).
GATE_MARGIN = 1e-3
ROUTER_MARGIN = 1e-3
MAX_RESEEDS = 100

TOLERANCES = common.TOLERANCES
OUTPUT_DTYPES = common.OUTPUT_DTYPES

# A gradient tensor with max|ref| <= STRUCTURAL_ZERO * G is zero by
# construction (G: the largest max|ref| of all gradient tensors).
STRUCTURAL_ZERO = 1e-10

# Required accuracy of PyTorch's own float32 gradients on a case, as a
# fraction of the f32 tolerance (conditioning margin for satdar).
F32_MARGIN = 0.1


@dataclasses.dataclass
class Case:
    """One model config to check.

    Attributes:
        name: short identifier, used in file names and the report.
        config: the config JSON object (MODELS.md section 1 fields).
        seed: seed of the tokens and (before any reseeding) the weights.
        token_dtype: dtype of the token tensor written for satdar.
    """
    name: str
    config: Dict[str, object]
    seed: int
    token_dtype: torch.dtype = torch.int64


def _config(vocab=48, hidden=32, ffn=40, layers=2, heads=4, kv_heads=4,
            tied=True, qk_norm=True, **design):
    """A small config JSON object; `design` adds the design fields."""
    config = {
        'vocab_size': vocab,
        'hidden_size': hidden,
        'intermediate_size': ffn,
        'num_hidden_layers': layers,
        'num_attention_heads': heads,
        'num_key_value_heads': kv_heads,
        'tie_word_embeddings': tied,
        'qk_norm': qk_norm,
        'max_position_embeddings': 64,
    }
    config.update(design)
    return config


def _moe(shared=0, norm=False, experts=4, top_k=2, dff=24):
    return {'num_experts': experts, 'top_k': top_k,
            'expert_intermediate_size': dff, 'num_shared_experts': shared,
            'router_aux_loss_coef': 0.01, 'router_z_loss_coef': 0.001,
            'norm_topk_prob': norm}


_SAT = {'value_residual': 'satformer'}
_PLUS = {'value_residual': 'resformer', 'resformer_mode': 'learnable_plus'}

# The seeds are ones whose first weight draw is usable (see random_weights),
# with some margin, so that no case needs redraws on a typical machine.
CASES = (
    # Value residuals under the standard residual.
    Case('satformer', _config(layers=3, **_SAT), 2001),
    Case('satformer_gqa', _config(vocab=40, heads=4, kv_heads=2, tied=False,
                                  **_SAT), 2002, torch.int32),
    Case('resformer_fixed', _config(layers=3, kv_heads=2,
                                    value_residual='resformer',
                                    resformer_mode='fixed'), 2003),
    Case('resformer_learnable_plus', _config(layers=3, **_PLUS), 2004),
    # AttnRes: full (block_size absent), blocks, a trailing partial block.
    Case('attnres_full', _config(residual='attnres'), 2111),
    Case('attnres_block2', _config(vocab=64, hidden=16, heads=2, kv_heads=1,
                                   residual='attnres', block_size=2), 2102),
    Case('attnres_block4_partial', _config(layers=3, residual='attnres',
                                           block_size=4), 2113, torch.int32),
    # Transparent Attention: full, blocks with a trailing partial block.
    Case('transparent_full', _config(residual='transparent'), 2141),
    Case('transparent_block4_partial', _config(layers=3, kv_heads=2,
                                               residual='transparent',
                                               block_size=4), 2142,
         torch.int32),
    # DAR, every variant.
    Case('dar_cross_full', _config(residual='dar', dar_variant='cross'),
         2221),
    Case('dar_cross_block4', _config(layers=3, kv_heads=2, residual='dar',
                                     dar_variant='cross', block_size=4),
         2232),
    Case('dar_self_kv', _config(tied=False, residual='dar',
                                dar_variant='self_kv', block_size=2), 2223),
    Case('dar_cross_v', _config(residual='dar', dar_variant='cross_v',
                                block_size=4), 2204),
    Case('dar_fixed_kv', _config(layers=3, qk_norm=False, residual='dar',
                                 dar_variant='fixed_kv', block_size=2),
         2365, torch.int32),
    # Hyper-connections.
    Case('hc_n4', _config(residual='hc', hc_streams=4), 2361),
    Case('hc_n2', _config(layers=3, hidden=16, heads=2, kv_heads=2,
                          residual='hc', hc_streams=2), 2502),
    Case('mhc_n4', _config(residual='mhc', hc_streams=4), 2323),
    Case('mhc_n3', _config(layers=3, kv_heads=2, tied=False, residual='mhc',
                           hc_streams=3), 2324),
    # Dense connections.
    Case('denseformer', _config(layers=3, residual='denseformer'), 2401),
    Case('muddformer', _config(layers=3, kv_heads=2,
                               residual='muddformer'), 2452),
    # MoE.
    Case('moe_top2', _config(moe=_moe()), 2501),
    Case('moe_shared_norm', _config(kv_heads=2, moe=_moe(shared=1,
                                                         norm=True)), 2502),
    # Compositions.
    Case('satformer_dar_block4', _config(layers=3, residual='dar',
                                         block_size=4, **_SAT), 3001),
    Case('satformer_transparent_moe', _config(
        layers=3, residual='transparent', block_size=2, moe=_moe(), **_SAT),
         3042),
    Case('resformer_plus_attnres_block2', _config(
        layers=3, residual='attnres', block_size=2, **_PLUS), 2602),
    # The dar-moe-7b setting in miniature: cross DAR, blocks of two layers,
    # top-2 of 4 experts, no shared experts, no renormalisation.
    Case('dar_moe', _config(layers=4, kv_heads=2, residual='dar',
                            dar_variant='cross', block_size=4, moe=_moe()),
         3233),
    Case('satformer_hc', _config(layers=3, residual='hc', hc_streams=4,
                                 **_SAT), 2954),
    Case('satformer_muddformer', _config(layers=3, kv_heads=2,
                                         residual='muddformer', **_SAT),
         2615),
)

# ---------------------------------------------------------------------------
# Weights, tokens and the reference gradients
# ---------------------------------------------------------------------------


def random_tokens(vocab_size: int, seed: int,
                  dtype: torch.dtype) -> torch.Tensor:
    """Uniform random ids in [0, vocab_size), [BATCH, SEQ_LEN + 1]."""
    return common.random_tokens(vocab_size, seed, dtype, BATCH, SEQ_LEN)


def draw_weights(config: torch_model.ModelConfig,
                 seed: int) -> Dict[str, torch.Tensor]:
    """One float64 draw of test weights (see MATRIX_STD and friends)."""
    return common.draw_weights(config, seed, MATRIX_STD, GAIN_STD,
                               mixing_std=MIXING_STD)


def nondifferentiable_point(config: torch_model.ModelConfig,
                            weights: Mapping[str, torch.Tensor],
                            tokens: torch.Tensor) -> Optional[str]:
    """Why the loss is (nearly) not differentiable at `weights`, or None.

    Flags a SATFormer gate logit with |logit| <= GATE_MARGIN (the ReLU kink)
    and, with MoE, a token whose k-th and (k+1)-th router probabilities are
    within ROUTER_MARGIN (relative) of each other (the top-k boundary).
    """
    trace = {}
    with torch.no_grad():
        common.build_model(config, weights).loss(tokens, trace)
    for logits in trace.get('gate_logits', []):
        smallest = float(logits.abs().min())
        if smallest <= GATE_MARGIN:
            return f'gate logit {smallest:.1e} near the ReLU kink'
    moe = config.moe
    for probs in trace.get('router_probs', []):
        if moe.top_k == moe.num_experts:
            continue
        ranked = probs.sort(dim=-1, descending=True).values
        kth, next_one = ranked[..., moe.top_k - 1], ranked[..., moe.top_k]
        gap = float(((kth - next_one) / kth).min())
        if gap <= ROUTER_MARGIN:
            return f'router top-k gap {gap:.1e} near a tie'
    return None


def reference_grads(config: torch_model.ModelConfig,
                    weights: Mapping[str, torch.Tensor],
                    tokens: torch.Tensor,
                    dtype: torch.dtype = torch.float64,
                    clean: bool = True) -> Dict[str, torch.Tensor]:
    """Loss and gradients by torch autograd, named like `satdar grad` output.

    A parameter the loss does not use (layer 0's ResFormer lambda2) gets a
    zero gradient.

    Args:
        config: the model config.
        weights: name -> tensor (any float dtype).
        tokens: [B, T+1] integer ids.
        dtype: precision of the computation.
        clean: set the gradients that are zero by construction (see
            STRUCTURAL_ZERO) to exact zero.

    Returns:
        `loss` ([1]) and `grad.<name>` for every weight, all of dtype.
    """
    result = common.autograd_grads(config, weights, tokens, dtype)
    if clean:
        floor = STRUCTURAL_ZERO * gradient_scale(result)
        for name, grad in result.items():
            if name != 'loss' and float(grad.abs().max()) <= floor:
                grad.zero_()
    return result


def gradient_scale(grads: Mapping[str, torch.Tensor]) -> float:
    """G: the largest max|grad| over the gradient tensors (not the loss)."""
    return max((float(g.abs().max()) for name, g in grads.items()
                if name != 'loss' and g.numel()), default=0.0)


def compare_grads(actual: Mapping[str, torch.Tensor],
                  expected: Mapping[str, torch.Tensor],
                  dtype: torch.dtype) -> common.Comparison:
    """Compares satdar's output with the reference, tensor by tensor.

    Names, dtypes and shapes must match exactly. The error of a tensor is
    max|diff| / max(max|ref|, 1e-30), except for a reference tensor that is
    exactly zero (zero by construction), where it is max|actual| / G.
    """
    result = common.compare(actual, expected, dtype)
    scale = max(gradient_scale(expected), 1e-30)
    for name in result.errors:
        if name != 'loss' and not expected[name].any():
            diff = float(actual[name].double().abs().max())
            result.errors[name] = diff / scale if math.isfinite(diff) \
                else math.inf
    return result


def f32_conditioning_problem(config: torch_model.ModelConfig,
                             weights: Mapping[str, torch.Tensor],
                             tokens: torch.Tensor) -> Optional[str]:
    """Why float32 cannot be checked to the f32 tolerance here, or None.

    PyTorch's float32 loss and gradients, with the batch in order and
    reversed (same values, other rounding), must be within F32_MARGIN of the
    f32 tolerance of the float64 ones.
    """
    expected = reference_grads(config, weights, tokens)
    limit = F32_MARGIN * TOLERANCES['f32']
    for batch in (tokens, tokens.flip(0)):
        actual = reference_grads(config, weights, batch, torch.float32,
                                 clean=False)
        name, err = compare_grads(actual, expected, torch.float32).worst()
        if not err <= limit:
            return f'float32 error {err:.1e} in {name}'
    return None


def random_weights(config: torch_model.ModelConfig, seed: int,
                   tokens: torch.Tensor
                   ) -> Tuple[Dict[str, torch.Tensor], int]:
    """Test weights clear of non-differentiable and ill-conditioned points.

    Args:
        config: the model config.
        seed: seed of the first draw; draw r uses seed + 100003 * r.
        tokens: the batch the weights are checked on.

    Returns:
        (weights, number of redraws).

    Raises:
        RuntimeError: no draw within MAX_RESEEDS was clear.
    """
    problems = collections.Counter()
    for redraw in range(MAX_RESEEDS):
        weights = draw_weights(config, seed + 100003 * redraw)
        problem = (nondifferentiable_point(config, weights, tokens) or
                   f32_conditioning_problem(config, weights, tokens))
        if problem is None:
            return weights, redraw
        problems[problem.split(' ', 1)[0]] += 1
    raise RuntimeError(f'no usable weights in {MAX_RESEEDS} draws: '
                       f'{dict(problems)}')


# ---------------------------------------------------------------------------
# Running satdar and comparing
# ---------------------------------------------------------------------------

@dataclasses.dataclass
class CaseInputs:
    """The inputs of a case: config, weights, tokens, and the redraws the
    weights took (0 when the case seed's first draw was usable)."""
    config: torch_model.ModelConfig
    weights: Dict[str, torch.Tensor]
    tokens: torch.Tensor
    redraws: int


_INPUTS_CACHE: Dict[str, CaseInputs] = {}


def case_inputs(case: Case) -> CaseInputs:
    """The inputs of a case (a pure function of it; cached per process)."""
    key = json.dumps([case.config, case.seed, str(case.token_dtype)],
                     sort_keys=True)
    if key not in _INPUTS_CACHE:
        config = torch_model.ModelConfig.from_dict(case.config)
        tokens = random_tokens(config.vocab_size, case.seed + 7919,
                               case.token_dtype)
        weights, redraws = random_weights(config, case.seed, tokens)
        _INPUTS_CACHE[key] = CaseInputs(config, weights, tokens, redraws)
    return _INPUTS_CACHE[key]


def write_case(case: Case, workdir: str
               ) -> Tuple[common.CaseFiles, int]:
    """Writes a case's config, weights and tokens; returns (paths, redraws)."""
    inputs = case_inputs(case)
    files = common.write_case_files(case.name, case.config, inputs.weights,
                                    inputs.tokens, workdir)
    return files, inputs.redraws


def check_case(case: Case, runner: common.Runner,
               workdir: str) -> List[bool]:
    """Runs one case in every dtype, prints a line each; returns pass flags."""
    try:
        files, redraws = write_case(case, workdir)
        config, weights, tokens = common.load_case(files)
        expected = reference_grads(config, weights, tokens)
    except (OSError, RuntimeError, ValueError) as e:
        for dtype in TOLERANCES:
            print(f'FAIL {case.name} {dtype}: no reference: {e}')
        return [False] * len(TOLERANCES)
    if redraws:
        print(f'    note: {case.name} weights redrawn {redraws} times')
    return common.check_outputs(case.name, files, expected, runner, workdir,
                                compare_fn=compare_grads, max_problems=8)


def select_cases(only: Optional[str]) -> List[Case]:
    """The cases whose name contains `only` (all when None)."""
    return [c for c in CASES if only is None or only in c.name]


# ---------------------------------------------------------------------------
# A fake satdar built on the reference (for --self-test)
# ---------------------------------------------------------------------------


def fake_grads(files: common.CaseFiles, dtype: str,
               mode: str = 'exact') -> Dict[str, torch.Tensor]:
    """What a faithful (or deliberately broken) satdar would write.

    Computes in the requested precision, so its f32 output shows whether f32
    arithmetic can meet the f32 tolerance on the case. mode 'perturb' spoils
    the largest gradient entry by 1e-3 relative, 'missing' drops that
    gradient, 'extra' adds one.
    """
    config, weights, tokens = common.load_case(files)
    grads = reference_grads(config, weights, tokens,
                            dtype=OUTPUT_DTYPES[dtype], clean=False)
    victim = max((name for name in grads if name != 'loss'),
                 key=lambda name: float(grads[name].abs().max()))
    if mode == 'perturb':
        flat = grads[victim].view(-1)
        flat[flat.abs().argmax()] *= 1 + 1e-3
    elif mode == 'missing':
        del grads[victim]
    elif mode == 'extra':
        grads['grad.model.bogus'] = torch.zeros(1, dtype=grads['loss'].dtype)
    return grads


def fake_satdar_main(argv: List[str], mode: str = 'exact') -> int:
    """`satdar grad` command line on top of fake_grads; returns exit status."""
    return common.fake_satdar_main(
        argv, lambda files, dtype: fake_grads(files, dtype, mode))


def write_fake_satdar(directory: str, mode: str) -> str:
    """Writes an executable running fake_satdar_main; returns its path."""
    return common.write_fake_satdar(
        os.path.join(directory, f'fake_designs_satdar_{mode}'),
        'designs_reference', mode)


def in_process_runner(mode: str = 'exact') -> common.Runner:
    """A Runner writing fake_grads directly, without a subprocess."""
    def run(files, dtype, out):
        common.write_safetensors(out, fake_grads(files, dtype, mode))
        return None
    return run


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------


def main(argv: Optional[List[str]] = None) -> int:
    def add_flags(parser: argparse.ArgumentParser) -> None:
        parser.add_argument('--only', metavar='NAME_SUBSTRING',
                            help='run only the cases whose name contains this')
        parser.add_argument('--list', action='store_true',
                            help='print the case names and exit')

    parser = common.argument_parser(__doc__, add_flags)
    args = parser.parse_args(argv)
    cases = select_cases(args.only)
    if args.list:
        for case in cases:
            print(case.name)
        return 0
    if not args.self_test and not (args.satdar and args.workdir):
        parser.error('--satdar and --workdir are required (or --self-test '
                     'or --list)')
    if not cases:
        parser.error(f'no case name contains {args.only!r}')
    # The reference models are tiny: one thread is fastest, and leaves the
    # cores to satdar.
    torch.set_num_threads(1)

    def run(workdir: str) -> Tuple[int, int]:
        if args.self_test:
            # pylint: disable=g-import-not-at-top
            import designs_self_test
            return designs_self_test.run(workdir, cases)
        runner = common.satdar_runner(os.path.abspath(args.satdar),
                                      args.threads, args.timeout)
        outcomes = []
        for case in cases:
            outcomes += check_case(case, runner, workdir)
        return common.tally(outcomes)

    return common.run_driver(args.workdir, 'satdar_designs_', run)


if __name__ == '__main__':
    sys.exit(main())
