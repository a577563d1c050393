"""PyTorch reference of every model design satdar trains.

An independent, plain PyTorch implementation of the Llama-style pre-norm
decoder of MODELS.md section 2 (shared/spec/MODELS.md) with the value
residuals of section 3 (SATFormer, ResFormer), the residual topologies of
section 4 (torch_topologies.py: AttnRes, Transparent Attention, DAR, HC,
mHC, DenseFormer, MUDDFormer) and the sparse MoE FFN of section 6 (torch_moe.py), exactly as
the contract and docs/MODELS.md (the project's resolution of the open
choices) define them. It is shared by:

  * tests/reference/baseline_reference.py and designs_reference.py, which
    run it in float64 and check the loss and gradients of `satdar grad`
    against torch autograd, and
  * bench/pytorch_baseline.py, which trains it in float32 as a speed baseline.

Parameter names follow MODELS.md section 5 and docs/MODELS.md exactly (they
are the module paths, so `state_dict()` keys are the safetensors tensor
names), e.g. `model.layers.0.self_attn.q_proj.weight`,
`model.layers.1.mlp_dar.write`, `model.final_res.query`.

Needs only torch (written against 1.13) and the standard library.
"""

import dataclasses
import math
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

import torch_layers
import torch_moe
import torch_topologies
# Re-exported: scripts use them as torch_model.<name>.
# pylint: disable=unused-import
from torch_layers import (MLP, RMSNorm, apply_rope, causal_mask, rms_norm,
                          rope_tables, rotate_half)
# pylint: enable=unused-import
from torch_moe import MoEConfig

VALUE_RESIDUALS = ('none', 'resformer', 'satformer')
RESFORMER_MODES = ('fixed', 'learnable_plus')


@dataclasses.dataclass
class ModelConfig:
    """Model hyper-parameters (MODELS.md section 1).

    Attributes:
        vocab_size: V, number of token ids.
        hidden_size: d, model width.
        intermediate_size: dff, width of the SwiGLU MLP (unused with moe).
        num_hidden_layers: L, number of decoder layers.
        num_attention_heads: H, number of query heads.
        num_key_value_heads: N, number of key/value heads (GQA); N divides H.
            None means N = H.
        max_position_embeddings: longest sequence the model accepts.
        rope_theta: RoPE base.
        rms_norm_eps: epsilon inside every RMSNorm.
        tie_word_embeddings: if True the LM head reuses the embedding matrix.
        qk_norm: if True, Q and K get a per-head RMSNorm before RoPE.
        initializer_range: standard deviation of the default weight init.
        value_residual: "none", "resformer" or "satformer".
        resformer_mode: "fixed" or "learnable_plus" (resformer only; the
            contract gives no default, "fixed" is ours).
        residual: one of torch_topologies.RESIDUALS.
        block_size: sublayers per history block (attnres, transparent, dar);
            0 means the topology's default (attnres and transparent 1 =
            full, dar 2 = Full DAR).
        dar_variant: one of torch_topologies.DAR_VARIANTS.
        hc_streams: n, streams of hc and mhc.
        moe: None for the dense MLP, else the MoE FFN of every layer.
    """
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: Optional[int] = None
    max_position_embeddings: int = 2048
    rope_theta: float = 1e4
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True
    qk_norm: bool = True
    initializer_range: float = 0.02
    value_residual: str = 'none'
    resformer_mode: str = 'fixed'
    residual: str = 'standard'
    block_size: int = 0
    dar_variant: str = 'cross'
    hc_streams: int = 4
    moe: Optional[MoEConfig] = None

    def __post_init__(self):
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if isinstance(self.moe, Mapping):
            self.moe = MoEConfig.from_dict(self.moe)
        self.validate()

    @property
    def head_dim(self) -> int:
        """dh = d / H."""
        return self.hidden_size // self.num_attention_heads

    @property
    def effective_block_size(self) -> int:
        """block_size with 0 resolved: 1 for attnres and transparent, 2 for
        dar."""
        if self.block_size:
            return self.block_size
        return 2 if self.residual == 'dar' else 1

    def validate(self) -> None:
        """Raises ValueError naming the field of an impossible config."""
        positive = ('vocab_size', 'hidden_size', 'intermediate_size',
                    'num_hidden_layers', 'num_attention_heads',
                    'num_key_value_heads', 'max_position_embeddings',
                    'hc_streams')
        for name in positive:
            value = getattr(self, name)
            if value < 1:
                raise ValueError(f'{name} must be >= 1, got {value}')
        if self.hidden_size % self.num_attention_heads:
            raise ValueError('num_attention_heads must divide hidden_size')
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                'num_key_value_heads must divide num_attention_heads')
        if self.head_dim % 2:
            raise ValueError(
                'hidden_size / num_attention_heads must be even (RoPE)')
        if self.rope_theta <= 0:
            raise ValueError('rope_theta must be > 0')
        if self.rms_norm_eps < 0:
            raise ValueError('rms_norm_eps must be >= 0')
        choices = (('value_residual', VALUE_RESIDUALS),
                   ('resformer_mode', RESFORMER_MODES),
                   ('residual', torch_topologies.RESIDUALS),
                   ('dar_variant', tuple(torch_topologies.DAR_VARIANTS)))
        for name, allowed in choices:
            if getattr(self, name) not in allowed:
                raise ValueError(f'{name} must be one of {allowed}, got '
                                 f'{getattr(self, name)!r}')
        if self.block_size < 0:
            raise ValueError(f'block_size must be >= 0, got '
                             f'{self.block_size}')
        size = self.effective_block_size
        if (self.residual in ('attnres', 'transparent') and size > 1 and
                size % 2):
            raise ValueError(f'block_size must be 1 or even for '
                             f'{self.residual}, got {size}')
        if self.residual == 'dar' and size % 2:
            raise ValueError(f'block_size must be even for dar, got {size}')
        if self.moe is not None:
            self.moe.validate()

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> 'ModelConfig':
        """Builds a config from a Hugging Face style JSON object.

        Args:
            raw: the parsed config JSON.

        Returns:
            The config.

        Raises:
            ValueError: a field is unknown or the config is impossible.
        """
        fields = {f.name for f in dataclasses.fields(cls)}
        for key in raw:
            if key not in fields:
                raise ValueError(f'unknown config field {key!r}')
        return cls(**raw)

    def to_dict(self) -> Dict[str, Any]:
        """Returns the config as a JSON-ready dict (section 1 field names)."""
        return dataclasses.asdict(self)


@dataclasses.dataclass
class ForwardState:
    """What the layers share during one forward pass.

    Attributes:
        cos: RoPE cos table, [T, dh].
        sin: RoPE sin table, [T, dh].
        mask: additive causal mask, [T, T].
        v1: layer 1's raw V projection [B, T, N, dh], once layer 1 ran
            (value residuals; not detached).
        lambda1: ResFormer learnable_plus lambda1 of layers 2..L, [L-1].
        aux_losses: MoE auxiliary losses, one per layer.
        trace: if not None, diagnostics by name: 'gate_logits' (SATFormer
            pre-ReLU gates), 'router_probs' (MoE), 'sinkhorn' (mHC M).
    """
    cos: torch.Tensor
    sin: torch.Tensor
    mask: torch.Tensor
    v1: Optional[torch.Tensor] = None
    lambda1: Optional[torch.Tensor] = None
    aux_losses: List[torch.Tensor] = dataclasses.field(default_factory=list)
    trace: Optional[Dict[str, list]] = None


class ValueResidualParams(torch_layers.MixingModule):
    """`model.value_residual`: ResFormer learnable_plus lambda1 parameters.

    lambda_scale [1] (s, init L) and lambda_logits [L-1] (q, init 0);
    lambda1 of layer n >= 2 (1-based) is s * softmax(q)[n-2].
    """

    def __init__(self, num_layers: int, dtype: torch.dtype):
        super().__init__()
        self.num_layers = num_layers
        self.lambda_scale = nn.Parameter(torch.zeros(1, dtype=dtype))
        self.lambda_logits = nn.Parameter(
            torch.zeros(num_layers - 1, dtype=dtype))
        self.reset_mixing()

    @torch.no_grad()
    def reset_mixing(self) -> None:
        self.lambda_scale.fill_(float(self.num_layers))
        self.lambda_logits.zero_()

    def forward(self) -> torch.Tensor:
        """lambda1 of layers 2..L, [L-1]."""
        return self.lambda_scale * torch.softmax(self.lambda_logits, dim=0)


class Attention(torch_layers.MixingModule):
    """Causal multi-head attention with GQA, optional QK-norm, RoPE and a
    value residual (section 3).

    Parameters: q/k/v/o_proj, q_norm/k_norm (qk_norm), value_gate [N, d]
    (satformer, layers i >= 1) and lambda2 [1] (resformer learnable_plus,
    every layer, init 0.5; layer 0's is unused).
    """

    def __init__(self, config: ModelConfig, layer_index: int,
                 dtype: torch.dtype):
        super().__init__()
        d, dh = config.hidden_size, config.head_dim
        self.layer_index = layer_index
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = dh
        q_out, kv_out = self.num_heads * dh, self.num_kv_heads * dh
        self.q_proj = nn.Linear(d, q_out, bias=False, dtype=dtype)
        self.k_proj = nn.Linear(d, kv_out, bias=False, dtype=dtype)
        self.v_proj = nn.Linear(d, kv_out, bias=False, dtype=dtype)
        self.o_proj = nn.Linear(q_out, d, bias=False, dtype=dtype)
        if config.qk_norm:
            self.q_norm = RMSNorm(dh, config.rms_norm_eps, dtype)
            self.k_norm = RMSNorm(dh, config.rms_norm_eps, dtype)
        else:
            self.q_norm = None
            self.k_norm = None
        self.value_residual = config.value_residual
        if self.value_residual == 'resformer':
            self.value_residual += '_' + config.resformer_mode
        if self.value_residual == 'satformer' and layer_index >= 1:
            self.value_gate = nn.Linear(d, self.num_kv_heads, bias=False,
                                        dtype=dtype)
        if self.value_residual == 'resformer_learnable_plus':
            self.lambda2 = nn.Parameter(torch.zeros(1, dtype=dtype))
        self.reset_mixing()

    @torch.no_grad()
    def reset_mixing(self) -> None:
        if hasattr(self, 'lambda2'):
            self.lambda2.fill_(0.5)

    def mix_values(self, v: torch.Tensor, x_v: torch.Tensor,
                   state: ForwardState) -> torch.Tensor:
        """V' = value_residual(n, x, V_n, V_1); records V_1 in layer 1.

        Args:
            v: this layer's raw V projection, [B, T, N, dh].
            x_v: the normalised input V was projected from, [B, T, d].
            state: the forward state (holds V_1 and lambda1).

        Returns:
            V', [B, T, N, dh].
        """
        if self.value_residual == 'none':
            return v
        if self.layer_index == 0:
            state.v1 = v
            return v
        if self.value_residual == 'satformer':
            logits = self.value_gate(x_v)  # [B, T, N]
            if state.trace is not None:
                state.trace.setdefault('gate_logits', []).append(
                    logits.detach())
            return v + F.relu(logits).unsqueeze(-1) * state.v1
        if self.value_residual == 'resformer_fixed':
            return 0.5 * state.v1 + 0.5 * v
        lambda1 = state.lambda1[self.layer_index - 1]
        return lambda1 * state.v1 + self.lambda2 * v

    def forward(self, x: torch.Tensor, state: ForwardState,
                x_k: Optional[torch.Tensor] = None,
                x_v: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Computes the attention sublayer output a = O Wo^T.

        Args:
            x: normalised input of Q (and of K and V unless given), [B, T, d].
            state: the forward state (RoPE tables, mask, value residual).
            x_k: normalised input of K (MUDDFormer), [B, T, d].
            x_v: normalised input of V (MUDDFormer), [B, T, d].

        Returns:
            [B, T, d].
        """
        x_k = x if x_k is None else x_k
        x_v = x if x_v is None else x_v
        b, t, _ = x.shape
        h, n, dh = self.num_heads, self.num_kv_heads, self.head_dim
        q = self.q_proj(x).view(b, t, h, dh)
        k = self.k_proj(x_k).view(b, t, n, dh)
        v = self.mix_values(self.v_proj(x_v).view(b, t, n, dh), x_v, state)
        if self.q_norm is not None:
            q = self.q_norm(q)
            k = self.k_norm(k)
        # Heads first, [B, heads, T, dh]. V is never rotated.
        q = apply_rope(q.transpose(1, 2), state.cos, state.sin)
        k = apply_rope(k.transpose(1, 2), state.cos, state.sin)
        v = v.transpose(1, 2)
        return self.o_proj(self.attend(q, k, v, state))

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               state: ForwardState) -> torch.Tensor:
        """Causal softmax attention: [B, H, T, dh] queries, [B, N, T, dh] keys
        and values -> [B, T, H * dh] (before the output projection)."""
        b, h, t, dh = q.shape
        n = k.shape[1]
        # GQA without copies: query head j = g * rep + r reads KV head
        # g = j // rep, so view the query heads as [B, N, rep, T, dh] and
        # broadcast K and V over the rep axis.
        rep = h // n
        q = q.reshape(b, n, rep, t, dh)
        k = k.unsqueeze(2)
        v = v.unsqueeze(2)
        # Scale and mask in place: autograd does not keep the product of
        # matmul, and this spares two [B, H, T, T] temporaries.
        scores = torch.matmul(q, k.transpose(-1, -2))
        scores = scores.mul_(1.0 / math.sqrt(dh)).add_(state.mask)
        probs = torch.softmax(scores, dim=-1)
        out = torch.matmul(probs, v)  # [B, N, rep, T, dh]
        return out.reshape(b, h, t, dh).transpose(1, 2).reshape(b, t, h * dh)


class DecoderLayer(nn.Module):
    """One decoder layer: two branches with their pre-norms, plus the
    topology modules of its two sublayers (torch_topologies.layer_modules).

    Under the standard residual: h' = h + attn(norm(h)),
    out = h' + mlp(norm(h')).
    """

    def __init__(self, config: ModelConfig, layer_index: int,
                 dtype: torch.dtype):
        super().__init__()
        d, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = RMSNorm(d, eps, dtype)
        self.self_attn = Attention(config, layer_index, dtype)
        self.post_attention_layernorm = RMSNorm(d, eps, dtype)
        if config.moe is None:
            self.mlp = MLP(d, config.intermediate_size, dtype)
        else:
            self.mlp = torch_moe.SparseMoE(d, config.moe, dtype)
        for name, module in torch_topologies.layer_modules(
                config, layer_index, dtype).items():
            self.add_module(name, module)

    def attention(self, x: torch.Tensor, state: ForwardState,
                  x_k: Optional[torch.Tensor] = None,
                  x_v: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Attention of already normalised inputs (see Attention.forward)."""
        return self.self_attn(x, state, x_k, x_v)

    def attn_branch(self, u: torch.Tensor,
                    state: ForwardState) -> torch.Tensor:
        """f_l of the attention sublayer: a from RMSNorm(u; g_attn)."""
        return self.self_attn(self.input_layernorm(u), state)

    def mlp_branch(self, u: torch.Tensor,
                   state: ForwardState) -> torch.Tensor:
        """f_l of the MLP sublayer: m from RMSNorm(u; g_mlp).

        An MoE layer appends its auxiliary loss to state.aux_losses.
        """
        z = self.post_attention_layernorm(u)
        if isinstance(self.mlp, torch_moe.SparseMoE):
            m, aux = self.mlp(z, state.trace)
            state.aux_losses.append(aux)
            return m
        return self.mlp(z)


class Backbone(nn.Module):
    """Embedding, decoder layers and final norm (the `model.` prefix), plus
    the model-level mixing parameters (value_residual, final_res,
    final_dar)."""

    def __init__(self, config: ModelConfig, dtype: torch.dtype):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size,
                                         config.hidden_size, dtype=dtype)
        self.layers = nn.ModuleList(
            DecoderLayer(config, i, dtype)
            for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        if (config.value_residual == 'resformer' and
                config.resformer_mode == 'learnable_plus'):
            self.value_residual = ValueResidualParams(
                config.num_hidden_layers, dtype)
        else:
            self.value_residual = None
        for name, module in torch_topologies.final_modules(
                config, dtype).items():
            self.add_module(name, module)

    def forward(self, input_ids: torch.Tensor,
                trace: Optional[Dict[str, list]] = None
                ) -> Tuple[torch.Tensor, torch.Tensor]:
        """Runs the model.

        Args:
            input_ids: [B, T] token ids of any integer dtype.
            trace: if not None, filled with diagnostics (see ForwardState).

        Returns:
            (final normalised hidden states [B, T, d], sum of the MoE
            auxiliary losses over layers (0 without MoE)).
        """
        config = self.config
        t = input_ids.shape[1]
        if t > config.max_position_embeddings:
            raise ValueError(f'sequence length {t} exceeds '
                             'max_position_embeddings '
                             f'{config.max_position_embeddings}')
        h = self.embed_tokens(input_ids.long())
        cos, sin = rope_tables(t, config.head_dim, config.rope_theta,
                               h.dtype, h.device)
        state = ForwardState(cos=cos, sin=sin,
                             mask=causal_mask(t, h.dtype, h.device),
                             trace=trace)
        if self.value_residual is not None:
            state.lambda1 = self.value_residual()
        h = torch_topologies.run_topology(config, self, h, state)
        aux = sum(state.aux_losses, torch.zeros((), dtype=h.dtype,
                                                device=h.device))
        return self.norm(h), aux


class CausalLM(nn.Module):
    """The decoder with its LM head and next-token loss.

    Attributes:
        config: the model config.
        model: the backbone (parameter names `model.*`).
        lm_head: output projection, or None when tie_word_embeddings.
    """

    def __init__(self, config: ModelConfig,
                 dtype: torch.dtype = torch.float32):
        super().__init__()
        self.config = config
        self.model = Backbone(config, dtype)
        if config.tie_word_embeddings:
            self.lm_head = None
        else:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size,
                                     bias=False, dtype=dtype)

    def output_weight(self) -> torch.Tensor:
        """W_lm: the embedding when tied, else lm_head.weight; [V, d]."""
        if self.lm_head is None:
            return self.model.embed_tokens.weight
        return self.lm_head.weight

    def forward_with_aux(self, input_ids: torch.Tensor,
                         trace: Optional[Dict[str, list]] = None
                         ) -> Tuple[torch.Tensor, torch.Tensor]:
        """(logits [B, T, V], summed MoE auxiliary loss) for ids [B, T]."""
        hidden, aux = self.model(input_ids, trace)
        return torch.matmul(hidden, self.output_weight().t()), aux

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Returns logits [B, T, V] for ids [B, T] of any integer dtype."""
        return self.forward_with_aux(input_ids)[0]

    def loss(self, tokens: torch.Tensor,
             trace: Optional[Dict[str, list]] = None) -> torch.Tensor:
        """Total loss of a [B, T+1] token batch, as `satdar grad` reports.

        The mean next-token cross-entropy (the logits at position t,
        computed from tokens[:, :T], scored against tokens[:, t+1], averaged
        over all B*T positions) plus, with MoE, the sum over layers of the
        balance loss and the z-loss.

        Args:
            tokens: integer ids, [B, T+1].
            trace: if not None, filled with diagnostics (see ForwardState).

        Returns:
            The scalar loss, in the model dtype.
        """
        logits, aux = self.forward_with_aux(tokens[:, :-1], trace)
        targets = tokens[:, 1:].long()
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                             targets.reshape(-1))
        if self.config.moe is None:
            return ce
        return ce + aux.to(ce.dtype)


def parameter_kinds(model: nn.Module) -> Dict[str, Tuple[str, float]]:
    """How init_weights treats each parameter.

    Args:
        model: any module of this reference.

    Returns:
        name -> (kind, noise_scale): kind 'matrix' (linears, embedding and a
        MixingModule's MATRIX_PARAMS: N(0, std)), 'gain' (RMSNorm weights:
        1) or 'mixing' (documented value, see MixingModule); noise_scale
        multiplies init_weights' mixing_std.
    """
    kinds = {}
    for module_name, module in model.named_modules():
        prefix = module_name + '.' if module_name else ''
        for name, _ in module.named_parameters(recurse=False):
            if isinstance(module, (nn.Linear, nn.Embedding)):
                kind = 'matrix'
            elif isinstance(module, RMSNorm):
                kind = 'gain'
            elif name in getattr(module, 'MATRIX_PARAMS', ()):
                kind = 'matrix'
            else:
                kind = 'mixing'
            scale = getattr(module, 'NOISE_SCALE', {}).get(name, 1.0)
            kinds[prefix + name] = (kind, scale)
    return kinds


@torch.no_grad()
def init_weights(model: CausalLM, std: float,
                 generator: Optional[torch.Generator] = None,
                 gain_std: float = 0.0, mixing_std: float = 0.0) -> None:
    """Initialises every parameter, drawing in named_parameters() order.

    Matrices (the linears, the embedding, mHC's fn and MUDDFormer's w1) get
    N(0, std); norm gains get 1 + gain_std * N(0, 1); mixing parameters get
    their documented initial value + mixing_std * noise_scale * N(0, 1)
    (see parameter_kinds). With gain_std = mixing_std = 0 and
    std = initializer_range this is the documented init; the baseline model
    draws exactly as before the other designs existed.

    Args:
        model: the model to initialise in place.
        std: standard deviation of the matrices (initializer_range).
        generator: random source; None uses torch's global generator.
        gain_std: spread of the norm gains around 1.
        mixing_std: spread of the mixing parameters around their init.
    """
    for module in model.modules():
        if isinstance(module, torch_layers.MixingModule):
            module.reset_mixing()
    kinds = parameter_kinds(model)
    for name, param in model.named_parameters():
        kind, scale = kinds[name]
        if kind == 'matrix':
            param.normal_(0.0, std, generator=generator)
        elif kind == 'gain':
            if gain_std:
                param.normal_(1.0, gain_std, generator=generator)
            else:
                param.fill_(1.0)
        elif mixing_std:
            noise = torch.empty_like(param).normal_(
                0.0, mixing_std * scale, generator=generator)
            param.add_(noise)
