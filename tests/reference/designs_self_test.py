"""Self-test of the design reference: `designs_reference.py --self-test`.

Checks, without the satdar binary, that

  * the parameters have exactly the names, shapes and initial values that
    shared/spec/MODELS.md and docs/MODELS.md give, and impossible configs
    are rejected naming the field;
  * autograd gradients of every case agree with finite differences;
  * the designs behave as documented where that is checkable: DenseFormer,
    MUDDFormer, HC and mHC start as the baseline; AttnRes and DAR at init
    retrieve uniform averages of the documented sources (block and partial
    block logic restated by index arithmetic); Transparent Attention at init
    is AttnRes at init and with random logits mixes those sources by
    softmax(z_l); DAR with symmetric streams is AttnRes; value residuals reduce to each other; mHC's Sinkhorn output is
    doubly stochastic; MoE routing, tie-breaking, aux and z-loss;
  * the driver's guards and comparison work (fake satdars).
"""

import io
import math
from typing import Dict, List, Sequence, Tuple

import torch
import torch.nn.functional as F

import designs_reference as dref
import reference_common as common
import torch_layers
import torch_model
import torch_topologies

# Finite differences: step and the required agreement.
FD_STEP = 1e-4
FD_TOLERANCE = 1e-6
FD_ENTRIES = 30

# Relative loss agreement of two formulations that are equal in exact
# arithmetic.
SAME = 1e-12

_SMALL = dict(vocab_size=40, hidden_size=16, intermediate_size=24,
              num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=32)


def _config(**fields) -> torch_model.ModelConfig:
    return torch_model.ModelConfig.from_dict({**_SMALL, **fields})


def _model(config: torch_model.ModelConfig, seed: int,
           mixing_std: float = 0.0) -> torch_model.CausalLM:
    """float64 model: matrices N(0, 0.3), gains 1 + 0.2 N(0, 1), mixing
    parameters at their documented init (+ mixing_std noise)."""
    model = torch_model.CausalLM(config, dtype=torch.float64)
    torch_model.init_weights(model, 0.3, torch.Generator().manual_seed(seed),
                             gain_std=0.2, mixing_std=mixing_std)
    return model


def _tokens(config: torch_model.ModelConfig, seed: int) -> torch.Tensor:
    return dref.random_tokens(config.vocab_size, seed, torch.int64)


def _loss(model: torch_model.CausalLM, tokens: torch.Tensor) -> float:
    with torch.no_grad():
        return float(model.loss(tokens))


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-300)


def _copy_shared(source: torch.nn.Module, target: torch.nn.Module) -> None:
    """Loads into target every parameter of source it has (all it needs)."""
    own = dict(source.named_parameters())
    target.load_state_dict(
        {name: own[name].detach() for name, _ in target.named_parameters()})


# ---------------------------------------------------------------------------
# Names, shapes, initial values, config validation
# ---------------------------------------------------------------------------


def _check_names_and_inits(_: str) -> str:
    d, dff_e, layers = 16, 12, 2
    base_names = {n: tuple(p.shape) for n, p in torch_model.CausalLM(
        _config(num_hidden_layers=layers)).named_parameters()}

    def extra(fn):
        names = {}
        for i in range(layers):
            names.update(fn(f'model.layers.{i}.', i))
        return names

    def sub(prefix, fields):
        return {f'{prefix}{k}': v for k, v in fields.items()}

    res = {'query': (d,), 'norm.weight': (d,)}
    dar = {'query': (2, d), 'norm.weight': (d,), 'mix': (2,),
           'transport': (1,), 'write': (2,)}
    hc = {'norm.weight': (d,), 'static_alpha': (3, 4), 'static_beta': (3,),
          'dynamic_alpha': (4, d), 'dynamic_beta': (1, d),
          'alpha_scale': (1,), 'beta_scale': (1,)}
    mhc = {'fn': (15, 3 * d), 'scale': (3,), 'base': (15,)}
    expert = {'gate_proj.weight': (dff_e, d), 'up_proj.weight': (dff_e, d),
              'down_proj.weight': (d, dff_e)}
    designs = {
        'satformer': ({'value_residual': 'satformer'}, {
            'model.layers.1.self_attn.value_gate.weight': (2, d)}),
        'learnable_plus': (
            {'value_residual': 'resformer',
             'resformer_mode': 'learnable_plus'},
            {**extra(lambda p, i: {p + 'self_attn.lambda2': (1,)}),
             'model.value_residual.lambda_scale': (1,),
             'model.value_residual.lambda_logits': (layers - 1,)}),
        'attnres': ({'residual': 'attnres'}, {
            **extra(lambda p, i: {**sub(p + 'attn_res.', res),
                                  **sub(p + 'mlp_res.', res)}),
            **sub('model.final_res.', res)}),
        # |X| at l = 2, 3, 4 and the final readout (l = 5): full, then
        # blocks of 4 (h0 and the partial until the block completes at l = 4).
        'transparent': ({'residual': 'transparent'}, {
            'model.layers.0.mlp_res.logits': (2,),
            'model.layers.1.attn_res.logits': (3,),
            'model.layers.1.mlp_res.logits': (4,),
            'model.final_res.logits': (5,)}),
        'transparent_block4': ({'residual': 'transparent', 'block_size': 4}, {
            'model.layers.0.mlp_res.logits': (2,),
            'model.layers.1.attn_res.logits': (2,),
            'model.layers.1.mlp_res.logits': (2,),
            'model.final_res.logits': (2,)}),
        'dar': ({'residual': 'dar'}, {
            **extra(lambda p, i: {**sub(p + 'attn_dar.', dar),
                                  **sub(p + 'mlp_dar.', dar)}),
            'model.final_dar.query': (2, d),
            'model.final_dar.norm.weight': (d,),
            'model.final_dar.mix': (2,)}),
        'hc': ({'residual': 'hc', 'hc_streams': 3}, extra(
            lambda p, i: {**sub(p + 'attn_hc.', hc),
                          **sub(p + 'mlp_hc.', hc)})),
        'mhc': ({'residual': 'mhc', 'hc_streams': 3}, extra(
            lambda p, i: {**sub(p + 'attn_mhc.', mhc),
                          **sub(p + 'mlp_mhc.', mhc)})),
        'denseformer': ({'residual': 'denseformer'}, extra(
            lambda p, i: {p + 'dwa.weight': (i + 2,)})),
        'muddformer': ({'residual': 'muddformer'}, extra(
            lambda p, i: {p + 'mudd.w1': (64, d),
                          p + 'mudd.w2': ((4 if i == 0 else 1) * (i + 2),
                                          64),
                          p + 'mudd.static': ((4 if i == 0 else 1), i + 2),
                          p + 'mudd.k_norm.weight': (d,),
                          p + 'mudd.v_norm.weight': (d,)})),
    }
    moe_fields = {'num_experts': 3, 'top_k': 2,
                  'expert_intermediate_size': dff_e, 'num_shared_experts': 2}
    moe_names = extra(lambda p, i: {
        p + 'mlp.router.weight': (3, d),
        **{k: v for e in range(3)
           for k, v in sub(f'{p}mlp.experts.{e}.', expert).items()},
        **{k: v for j in range(2)
           for k, v in sub(f'{p}mlp.shared_experts.{j}.', expert).items()}})
    dense_mlp = {n for n in base_names if '.mlp.' in n}
    designs['moe'] = ({'moe': moe_fields}, moe_names)
    for design, (fields, names) in designs.items():
        model = torch_model.CausalLM(_config(num_hidden_layers=layers,
                                             **fields), torch.float64)
        expected = dict(base_names, **names)
        if design == 'moe':
            expected = {n: s for n, s in expected.items()
                        if n not in dense_mlp}
        actual = {n: tuple(p.shape) for n, p in model.named_parameters()}
        assert actual == expected, (design, set(actual) ^ set(expected),
                                    {n for n in actual
                                     if actual[n] != expected.get(n)})

    # Documented initial values.
    def init(**fields):
        model = torch_model.CausalLM(_config(num_hidden_layers=layers,
                                             **fields), torch.float64)
        torch_model.init_weights(model, 0.02,
                                 torch.Generator().manual_seed(1))
        return dict(model.named_parameters())

    def equal(value, expected):
        return torch.equal(value.detach(), torch.tensor(
            expected, dtype=torch.float64))

    p = init(value_residual='resformer', resformer_mode='learnable_plus')
    assert equal(p['model.value_residual.lambda_scale'], [layers])
    assert equal(p['model.value_residual.lambda_logits'], [0.0])
    assert equal(p['model.layers.0.self_attn.lambda2'], [0.5])
    p = init(residual='dar')
    for i, kind, write in ((0, 'attn', [-2, 2]), (0, 'mlp', [2, -2]),
                           (1, 'attn', [-2, 2])):
        prefix = f'model.layers.{i}.{kind}_dar.'
        assert equal(p[prefix + 'write'], write), prefix
        assert equal(p[prefix + 'transport'], [2.0])
        assert not p[prefix + 'query'].any() and not p[prefix + 'mix'].any()
        assert equal(p[prefix + 'norm.weight'], [1.0] * d)
    p = init(residual='transparent')
    for name in ('model.layers.0.mlp_res.logits', 'model.final_res.logits'):
        assert not p[name].any(), name
    p = init(residual='hc', hc_streams=3)
    for i, kind, k in ((0, 'attn', 0), (0, 'mlp', 1), (1, 'attn', 2),
                       (1, 'mlp', 3)):
        alpha = torch.zeros(3, 4, dtype=torch.float64)
        alpha[k % 3, 0] = 1
        alpha[:, 1:] = torch.eye(3)
        prefix = f'model.layers.{i}.{kind}_hc.'
        assert torch.equal(p[prefix + 'static_alpha'].detach(), alpha)
        assert equal(p[prefix + 'static_beta'], [1.0] * 3)
        assert equal(p[prefix + 'alpha_scale'], [0.01])
        assert equal(p[prefix + 'beta_scale'], [0.01])
        assert not p[prefix + 'dynamic_alpha'].any()
        assert not p[prefix + 'dynamic_beta'].any()
    p = init(residual='mhc', hc_streams=3)
    base = [-math.log(2)] * 3 + [0.0] * 3 + torch.eye(3).mul(4).flatten(
    ).tolist()
    assert equal(p['model.layers.1.mlp_mhc.base'], base)
    assert equal(p['model.layers.1.mlp_mhc.scale'], [0.01] * 3)
    assert 0.01 < float(p['model.layers.1.mlp_mhc.fn'].std()) < 0.03
    p = init(residual='mhc', hc_streams=2)
    assert equal(p['model.layers.0.attn_mhc.base'][:2], [0.0, 0.0])
    p = init(residual='denseformer')
    assert equal(p['model.layers.1.dwa.weight'], [0.0, 0.0, 1.0])
    p = init(residual='muddformer')
    assert equal(p['model.layers.0.mudd.static'], [[0.0, 1.0]] * 4)
    assert equal(p['model.layers.1.mudd.static'], [[0.0, 0.0, 1.0]])
    assert not p['model.layers.0.mudd.w2'].any()
    assert 0.01 < float(p['model.layers.0.mudd.w1'].std()) < 0.03
    # K = C*S rounded up to a multiple of 64: layer 15 of 20 has 4 * 17.
    mudd = torch_topologies.MuddConnection(d, 15, 20, 1e-6, torch.float64)
    assert tuple(mudd.w1.shape) == (128, d), mudd.w1.shape
    assert tuple(mudd.w2.shape) == (68, 128), mudd.w2.shape
    return (f'{len(designs)} designs: names and shapes exact, inits as '
            'documented')


def _check_config_validation(_: str) -> str:
    bad = {
        'block_size': {'residual': 'dar', 'block_size': 3},
        'block_size ': {'residual': 'attnres', 'block_size': 5},
        ' block_size': {'residual': 'transparent', 'block_size': 3},
        'block_size  ': {'residual': 'dar', 'block_size': 1},
        'dar_variant': {'residual': 'dar', 'dar_variant': 'both'},
        'residual': {'residual': 'highway'},
        'value_residual': {'value_residual': 'resnet'},
        'resformer_mode': {'value_residual': 'resformer',
                           'resformer_mode': 'learnable'},
        'hc_streams': {'residual': 'hc', 'hc_streams': 0},
        'moe.top_k': {'moe': {'num_experts': 2, 'top_k': 3,
                              'expert_intermediate_size': 4}},
        'moe.capacity': {'moe': {'num_experts': 2, 'top_k': 1,
                                 'expert_intermediate_size': 4,
                                 'capacity': 1.0}},
        'bogus_field': {'bogus_field': 1},
    }
    for field, fields in bad.items():
        try:
            _config(**fields)
        except (ValueError, TypeError) as e:
            assert field.strip() in str(e), (field, str(e))
            continue
        raise AssertionError(f'{fields} accepted')
    assert _config(residual='dar').effective_block_size == 2
    assert _config(residual='attnres').effective_block_size == 1
    assert _config(residual='attnres', block_size=1).effective_block_size == 1
    assert _config(residual='transparent').effective_block_size == 1
    return f'{len(bad)} impossible configs rejected naming the field'


# ---------------------------------------------------------------------------
# Finite differences
# ---------------------------------------------------------------------------


def _pick_entries(model: torch_model.CausalLM,
                  grads: Dict[str, torch.Tensor],
                  generator: torch.Generator) -> List[Tuple[str, int]]:
    """~FD_ENTRIES (name, flat index) pairs, two thirds of them in the
    design's own parameters; in each tensor an entry with a large |grad|."""
    config = model.config
    plain = torch_model.ModelConfig.from_dict({
        **{k: v for k, v in config.to_dict().items()
           if k not in ('value_residual', 'residual', 'moe')}})
    baseline = {n for n, _ in torch_model.CausalLM(plain).named_parameters()}

    def shuffled(names):
        order = torch.randperm(len(names), generator=generator).tolist()
        return [names[i] for i in order]

    names = [n for n, _ in model.named_parameters()]
    own = shuffled([n for n in names if n not in baseline])
    rest = shuffled([n for n in names if n in baseline])
    take = min(len(own), 2 * FD_ENTRIES // 3)
    chosen = own[:take] + rest[:FD_ENTRIES - take]
    entries = []
    for name in chosen:
        grad = grads['grad.' + name].reshape(-1).abs()
        candidates = torch.nonzero(grad >= 0.1 * grad.max()).reshape(-1)
        pick = int(torch.randint(len(candidates), (1,), generator=generator))
        entries.append((name, int(candidates[pick])))
    return entries


def finite_difference_errors(case: dref.Case
                             ) -> Tuple[int, float, str]:
    """Checks FD_ENTRIES gradient entries of a case by finite differences.

    Uses the fourth-order central difference
    (8 (f(x+h) - f(x-h)) - (f(x+2h) - f(x-2h))) / 12h in float64; the error
    of an entry is |fd - autograd| / max(|autograd|, 1e-2 * max|grad| of
    its tensor, 1e-4 * G).

    Returns:
        (entries checked, worst error, where).
    """
    inputs = dref.case_inputs(case)
    grads = dref.reference_grads(inputs.config, inputs.weights,
                                 inputs.tokens, clean=False)
    scale = dref.gradient_scale(grads)
    model = common.build_model(inputs.config, inputs.weights)
    params = dict(model.named_parameters())
    generator = torch.Generator().manual_seed(case.seed)
    worst, where = 0.0, ''
    entries = _pick_entries(model, grads, generator)
    for name, index in entries:
        flat = params[name].data.view(-1)
        saved = float(flat[index])
        values = []
        for offset in (2, 1, -1, -2):
            flat[index] = saved + offset * FD_STEP
            values.append(_loss(model, inputs.tokens))
        flat[index] = saved
        numeric = (8 * (values[1] - values[2]) -
                   (values[0] - values[3])) / (12 * FD_STEP)
        grad = grads['grad.' + name]
        analytic = float(grad.view(-1)[index])
        denominator = max(abs(analytic), 1e-2 * float(grad.abs().max()),
                          1e-4 * scale)
        err = abs(numeric - analytic) / denominator
        if err > worst:
            worst, where = err, f'{name}[{index}]'
    return len(entries), worst, where


def _check_finite_differences(_: str, cases: Sequence[dref.Case]) -> str:
    total, worst, where = 0, 0.0, ''
    for case in cases:
        count, err, at = finite_difference_errors(case)
        assert err < FD_TOLERANCE, (case.name, at, err)
        total += count
        if err > worst:
            worst, where = err, f'{case.name} {at}'
    return (f'{len(cases)} cases, {total} entries, worst {worst:.1e} '
            f'({where})')


# ---------------------------------------------------------------------------
# Documented behaviour
# ---------------------------------------------------------------------------


def _check_init_equals_baseline(_: str) -> str:
    """DenseFormer, MUDDFormer, HC and mHC (fn = 0) start as the baseline.

    HC and mHC end with sum_j H_j = n h, which the final RMSNorm maps to the
    baseline's output exactly only when eps = 0.
    """
    variants = {
        'denseformer': {'residual': 'denseformer'},
        'muddformer': {'residual': 'muddformer'},
        'muddformer+satformer': {'residual': 'muddformer',
                                 'value_residual': 'satformer'},
        'hc': {'residual': 'hc', 'hc_streams': 3, 'rms_norm_eps': 0.0},
        'mhc': {'residual': 'mhc', 'hc_streams': 4, 'rms_norm_eps': 0.0},
    }
    worst = 0.0
    for seed, (name, fields) in enumerate(variants.items()):
        config = _config(**fields)
        model = _model(config, seed)
        with torch.no_grad():
            for layer in model.model.layers:
                if hasattr(layer, 'mudd'):  # K and V norms = Q's norm.
                    layer.mudd.k_norm.weight.copy_(
                        layer.input_layernorm.weight)
                    layer.mudd.v_norm.weight.copy_(
                        layer.input_layernorm.weight)
                for kind in ('attn', 'mlp'):
                    if hasattr(layer, kind + '_mhc'):
                        getattr(layer, kind + '_mhc').fn.zero_()
        plain = {k: v for k, v in fields.items() if k in (
            'rms_norm_eps', 'value_residual')}
        baseline = torch_model.CausalLM(_config(**plain), torch.float64)
        _copy_shared(model, baseline)
        tokens = _tokens(config, seed)
        err = _rel(_loss(model, tokens), _loss(baseline, tokens))
        assert err < SAME, (name, err)
        worst = max(worst, err)
    return f'{", ".join(variants)}: worst relative difference {worst:.1e}'


def _check_value_residual_reductions(_: str) -> str:
    """Closed SATFormer gates give the baseline; learnable_plus with
    s = (L-1)/2, q = 0, lambda2 = 0.5 gives fixed; fixed differs from none."""
    tokens = _tokens(_config(), 3)
    sat = _model(_config(value_residual='satformer'), 1)
    with torch.no_grad():
        for layer in sat.model.layers[1:]:
            layer.self_attn.value_gate.weight.zero_()
    baseline = torch_model.CausalLM(_config(), torch.float64)
    _copy_shared(sat, baseline)
    err_sat = _rel(_loss(sat, tokens), _loss(baseline, tokens))
    assert err_sat < SAME, err_sat

    plus = _model(_config(value_residual='resformer',
                          resformer_mode='learnable_plus'), 2)
    with torch.no_grad():
        plus.model.value_residual.lambda_scale.fill_(
            (plus.config.num_hidden_layers - 1) / 2)
    fixed = torch_model.CausalLM(_config(value_residual='resformer',
                                         resformer_mode='fixed'),
                                 torch.float64)
    _copy_shared(plus, fixed)
    err_plus = _rel(_loss(plus, tokens), _loss(fixed, tokens))
    assert err_plus < SAME, err_plus
    baseline = torch_model.CausalLM(_config(), torch.float64)
    _copy_shared(plus, baseline)
    assert _rel(_loss(fixed, tokens), _loss(baseline, tokens)) > 1e-6
    return (f'closed gates = baseline ({err_sat:.0e}), learnable_plus at '
            f'0.5/0.5 = fixed ({err_plus:.0e})')


def _forward_state(model: torch_model.CausalLM,
                   input_ids: torch.Tensor) -> torch_model.ForwardState:
    config, t = model.config, input_ids.shape[1]
    cos, sin = torch_layers.rope_tables(t, config.head_dim,
                                        config.rope_theta, torch.float64)
    return torch_model.ForwardState(
        cos=cos, sin=sin, mask=torch_layers.causal_mask(t, torch.float64))


def _loss_from_final(model: torch_model.CausalLM, u: torch.Tensor,
                     tokens: torch.Tensor) -> float:
    logits = model.model.norm(u) @ model.output_weight().t()
    return float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                 tokens[:, 1:].reshape(-1)))


def _branches(model):
    for layer in model.model.layers:
        yield layer.attn_branch
        yield layer.mlp_branch


def _check_attnres_init(_: str) -> str:
    """At init (queries 0) AttnRes reads the plain mean of its sources; the
    sources are restated here by index arithmetic: h_0, the sums of the
    completed blocks, and the partial sum of the current block."""
    checked = []
    for block in (1, 2, 4, 6):
        config = _config(residual='attnres', block_size=block)
        model = _model(config, 10 + block)
        tokens = _tokens(config, 20 + block)
        ids = tokens[:, :-1]
        state = _forward_state(model, ids)
        h0 = model.model.embed_tokens(ids)
        ys = []

        def sources(l):  # What sublayer l (1-based; 2L+1: final) reads.
            done = (l - 1) // block
            out = [h0] + [sum(ys[b * block:(b + 1) * block])
                          for b in range(done)]
            if l - 1 > done * block:
                out.append(sum(ys[done * block:l - 1]))
            return out

        with torch.no_grad():
            for l, branch in enumerate(_branches(model), start=1):
                xs = sources(l)
                ys.append(branch(sum(xs) / len(xs), state))
            xs = sources(2 * config.num_hidden_layers + 1)
            expected = _loss_from_final(model, sum(xs) / len(xs), tokens)
        err = _rel(_loss(model, tokens), expected)
        assert err < SAME, (block, err)
        checked.append(str(block))
    return f'block sizes {", ".join(checked)} with L = 3'


def _check_dar_init(_: str) -> str:
    """At init (queries and mix 0) DAR reads 0.5 (mean X^val(0) + mean
    X^val(1)); the two streams' entries are restated by index arithmetic,
    with rho = sigmoid(2) and beta^s = 2 sigmoid(+-2) by the parity of l."""
    rho = 1 / (1 + math.exp(-2))

    def beta(l, s):
        return 2 / (1 + math.exp(-2.0 if s == l % 2 else 2.0))

    checked = []
    for variant, block in (('cross', 2), ('fixed_kv', 4), ('cross_v', 4),
                           ('self_kv', 6)):
        config = _config(residual='dar', dar_variant=variant,
                         block_size=block)
        _, values = torch_topologies.DAR_VARIANTS[variant]
        model = _model(config, 30 + block)
        tokens = _tokens(config, 40 + block)
        ids = tokens[:, :-1]
        state = _forward_state(model, ids)
        h0 = model.model.embed_tokens(ids)
        ys = []

        def entry(first, last):  # (P^0, P^1) after sublayers first..last.
            p = [0, 0]
            for l in range(first, last + 1):
                y = ys[l - 1]
                p = [rho * p[0] + (1 - rho) * p[1] + beta(l, 0) * y,
                     (1 - rho) * p[0] + rho * p[1] + beta(l, 1) * y]
            return p

        def read(l):  # u of sublayer l (1-based; 2L+1: final).
            done = (l - 1) // block
            streams = [[h0], [h0]]
            for b in range(done):
                p = entry(b * block + 1, (b + 1) * block)
                streams[0].append(p[0])
                streams[1].append(p[1])
            if l - 1 > done * block:
                p = entry(done * block + 1, l - 1)
                streams[0].append(p[0])
                streams[1].append(p[1])
            means = [sum(x) / len(x) for x in streams]
            return 0.5 * (means[values[0]] + means[values[1]])

        with torch.no_grad():
            for l, branch in enumerate(_branches(model), start=1):
                ys.append(branch(read(l), state))
            expected = _loss_from_final(
                model, read(2 * config.num_hidden_layers + 1), tokens)
            p = entry(1, 2)
            assert float((p[0] - p[1]).abs().max()) > 1e-3  # Streams differ.
        err = _rel(_loss(model, tokens), expected)
        assert err < SAME, (variant, block, err)
        checked.append(f'{variant}/{block}')
    return f'{", ".join(checked)} with L = 3'


def _check_transparent(_: str) -> str:
    """Transparent Attention at init (logits 0) is AttnRes at init (both the
    plain mean of the sources); with random logits it reads
    sum_i softmax(z_l)_i X_i over the sources restated by index arithmetic,
    the first sublayer h_0 as it is."""
    checked = []
    for block in (1, 2, 4, 6):
        config = _config(residual='transparent', block_size=block)
        model = _model(config, 70 + block)
        attnres = torch_model.CausalLM(
            _config(residual='attnres', block_size=block), torch.float64)
        torch_model.init_weights(attnres, 0.02,
                                 torch.Generator().manual_seed(1))
        own = dict(model.named_parameters())
        attnres.load_state_dict({
            name: own[name].detach() if name in own else param.detach()
            for name, param in attnres.named_parameters()})
        tokens = _tokens(config, 80 + block)
        err = _rel(_loss(model, tokens), _loss(attnres, tokens))
        assert err < SAME, ('init', block, err)

        model = _model(config, 90 + block, mixing_std=0.7)
        ids = tokens[:, :-1]
        state = _forward_state(model, ids)
        h0 = model.model.embed_tokens(ids)
        ys = []
        mixes = [getattr(layer, kind + '_res', None)
                 for layer in model.model.layers for kind in ('attn', 'mlp')]
        mixes.append(model.model.final_res)

        def sources(l):  # What sublayer l (1-based; 2L+1: final) reads.
            done = (l - 1) // block
            out = [h0] + [sum(ys[b * block:(b + 1) * block])
                          for b in range(done)]
            if l - 1 > done * block:
                out.append(sum(ys[done * block:l - 1]))
            return out

        def mix(l):
            xs = sources(l)
            if l == 1:
                assert len(xs) == 1
                return xs[0]
            weights = torch.softmax(mixes[l - 1].logits, dim=0)
            assert len(weights) == len(xs), (l, len(weights), len(xs))
            return sum(w * x for w, x in zip(weights, xs))

        with torch.no_grad():
            for l, branch in enumerate(_branches(model), start=1):
                ys.append(branch(mix(l), state))
            final = 2 * config.num_hidden_layers + 1
            expected = _loss_from_final(model, mix(final), tokens)
        err = _rel(_loss(model, tokens), expected)
        assert err < SAME, ('random', block, err)
        checked.append(str(block))
    return f'block sizes {", ".join(checked)} with L = 3, at init and random'


def _check_dar_symmetric_is_attnres(_: str) -> str:
    """With write = 0 (beta = 1 for both streams) and equal query rows the
    two DAR streams stay identical and DAR is AttnRes with the same query
    and key norm, for every variant, whatever the mix and transport."""
    checked = []
    for variant in torch_topologies.DAR_VARIANTS:
        for block in (2, 4):
            config = _config(residual='dar', dar_variant=variant,
                             block_size=block)
            dar = _model(config, 50 + block, mixing_std=0.5)
            attnres = torch_model.CausalLM(
                _config(residual='attnres', block_size=block),
                torch.float64)
            state = {}
            for name, param in dar.named_parameters():
                if name.endswith('_dar.write'):
                    param.data.zero_()
                if name.endswith('_dar.query'):
                    param.data[1] = param.data[0]
                    state[name.replace('_dar.', '_res.')] = param.data[0]
                elif '_dar.norm' in name:
                    state[name.replace('_dar.', '_res.')] = param.data
                elif '_dar.' not in name:
                    state[name] = param.data
            attnres.load_state_dict(state)
            tokens = _tokens(config, 60 + block)
            err = _rel(_loss(dar, tokens), _loss(attnres, tokens))
            assert err < SAME, (variant, block, err)
        checked.append(variant)
    return f'{", ".join(checked)}, block sizes 2 and 4'


def _check_sinkhorn(_: str) -> str:
    """mHC's M is doubly stochastic; a doubly stochastic softmax stays."""
    worst_row = {}
    for label, mixing_std in (('init', 0.0), ('random', 0.3)):
        config = _config(residual='mhc', hc_streams=4)
        model = torch_model.CausalLM(config, torch.float64)
        torch_model.init_weights(model, 0.02, torch.Generator().manual_seed(7),
                                 mixing_std=mixing_std)
        trace = {}
        with torch.no_grad():
            model.loss(_tokens(config, 8), trace)
        matrices = torch.stack(trace['sinkhorn'])
        assert len(trace['sinkhorn']) == 2 * config.num_hidden_layers
        cols = (matrices.sum(dim=-2) - 1).abs().max()
        rows = (matrices.sum(dim=-1) - 1).abs().max()
        assert cols < 1e-12, (label, float(cols))
        worst_row[label] = float(rows)
    # Sinkhorn converges slowly on the diagonally dominant softmax(4 I + ..):
    # 20 iterations leave the rows ~1e-5 off at init.
    assert worst_row['init'] < 1e-4 and worst_row['random'] < 1e-2, worst_row
    logits = 4 * torch.eye(5, dtype=torch.float64)
    expected = torch.softmax(logits, dim=-1)
    assert torch.allclose(torch_topologies.sinkhorn(logits), expected,
                          rtol=0, atol=1e-15)
    return (f'columns sum to 1; rows within {worst_row["init"]:.0e} at init, '
            f'{worst_row["random"]:.0e} with random weights')


def _check_moe(_: str) -> str:
    """MoE against dense MLPs, with the router at 0 (every probability 1/E,
    all tied): top-k then takes experts 0..k-1, the balance loss is exactly
    coef and the z-loss coef * log(E)^2 in every layer."""
    results = []
    for experts, top_k, shared, norm in ((4, 2, 0, False), (3, 3, 1, True)):
        moe = {'num_experts': experts, 'top_k': top_k,
               'expert_intermediate_size': 24, 'num_shared_experts': shared,
               'norm_topk_prob': norm, 'router_aux_loss_coef': 0.03,
               'router_z_loss_coef': 0.002}
        config = _config(moe=moe)
        model = _model(config, 70 + experts)
        dense = _model(_config(), 80 + experts)  # dff 24 as the experts.
        # Routed expert e < k: the dense MLP with down scaled so that the
        # routed weights (1/E each, or 1/k renormalised) times the shared
        # experts' sum give the dense MLP once.
        routed_weight = (1 / top_k) if norm else (1 / experts)
        share = 0.5 if shared else 1.0
        with torch.no_grad():
            for layer, plain in zip(model.model.layers, dense.model.layers):
                layer.mlp.router.weight.zero_()
                for e, expert in enumerate(layer.mlp.experts):
                    if e < top_k:
                        expert.load_state_dict(plain.mlp.state_dict())
                        expert.down_proj.weight.mul_(
                            share / (routed_weight * top_k))
                for expert in layer.mlp.shared_experts:
                    expert.load_state_dict(plain.mlp.state_dict())
                    expert.down_proj.weight.mul_((1 - share) / shared)
            state = {n: p for n, p in model.named_parameters()}
            dense.load_state_dict(
                {n: state.get(n, p) for n, p in dense.named_parameters()})
        tokens = _tokens(config, 90 + experts)
        aux = config.num_hidden_layers * (
            moe['router_aux_loss_coef'] +
            moe['router_z_loss_coef'] * math.log(experts) ** 2)
        err = _rel(_loss(model, tokens), _loss(dense, tokens) + aux)
        assert err < SAME, (experts, top_k, err)
        results.append(f'E={experts} k={top_k} shared={shared} norm={norm}')
    return '; '.join(results)


# ---------------------------------------------------------------------------
# The driver
# ---------------------------------------------------------------------------


def _check_guards(_: str) -> str:
    """Weights at a ReLU kink or a top-k tie are flagged."""
    for name, zeroed in (('satformer', 'value_gate'),
                         ('moe_top2', 'mlp.router')):
        case = next(c for c in dref.CASES if c.name == name)
        inputs = dref.case_inputs(case)
        assert dref.nondifferentiable_point(
            inputs.config, inputs.weights, inputs.tokens) is None, name
        weights = {k: (torch.zeros_like(v) if zeroed in k else v)
                   for k, v in inputs.weights.items()}
        problem = dref.nondifferentiable_point(inputs.config, weights,
                                               inputs.tokens)
        assert problem is not None, name
    return 'gate logits at 0 and tied router probabilities flagged'


def _check_fake_satdar(workdir: str, cases: Sequence[dref.Case]) -> str:
    """A faithful fake satdar passes every case in f64 and f32 (so PyTorch's
    own float32 meets the f32 tolerance); broken ones fail."""
    log = io.StringIO()
    outcomes = common.run_quietly(log, lambda: [
        ok for case in cases
        for ok in dref.check_case(case, dref.in_process_runner(), workdir)])
    assert all(outcomes) and len(outcomes) == 2 * len(cases), log.getvalue()
    probe = cases[0]
    broken = {}
    for mode in ('exact', 'perturb'):  # Through the command line.
        satdar = dref.write_fake_satdar(workdir, mode)
        runner = common.satdar_runner(satdar, threads=1, timeout=600)
        broken[mode] = common.run_quietly(
            log, lambda: dref.check_case(probe, runner, workdir))
    for mode in ('missing', 'extra'):
        broken[mode] = common.run_quietly(log, lambda: dref.check_case(
            probe, dref.in_process_runner(mode), workdir))
    assert broken.pop('exact') == [True, True], log.getvalue()
    for mode, flags in broken.items():
        assert flags == [False, False], (mode, log.getvalue())
    return (f'{len(cases)} cases pass in f64 and f32; perturbed, missing '
            f'and extra gradients fail')


def run(workdir: str, cases: Sequence[dref.Case]) -> Tuple[int, int]:
    """Runs every self-test, printing a line each; returns (passed, failed).

    Args:
        workdir: scratch directory.
        cases: the driver cases to use (finite differences, fake satdar).
    """
    tests = (
        ('parameter names, shapes and inits', _check_names_and_inits),
        ('config validation', _check_config_validation),
        ('gradients match finite differences',
         lambda w: _check_finite_differences(w, cases)),
        ('designs start as the baseline', _check_init_equals_baseline),
        ('value residual reductions', _check_value_residual_reductions),
        ('attnres at init', _check_attnres_init),
        ('transparent attention', _check_transparent),
        ('dar at init', _check_dar_init),
        ('dar with symmetric streams is attnres',
         _check_dar_symmetric_is_attnres),
        ('mhc sinkhorn', _check_sinkhorn),
        ('moe routing and aux losses', _check_moe),
        ('guards', _check_guards),
        ('comparison vs fake satdar',
         lambda w: _check_fake_satdar(w, cases)),
    )
    return common.run_self_tests(tests, workdir)
