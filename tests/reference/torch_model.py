"""PyTorch reference of the satdar baseline decoder (MODELS.md section 2).

An independent, plain PyTorch implementation of the Llama-style pre-norm
decoder that satdar trains. It is shared by:

  * tests/reference/baseline_reference.py, which runs it in float64 and checks
    the loss and gradients of `satdar grad` against torch autograd, and
  * bench/pytorch_baseline.py, which trains it in float32 as a speed baseline.

Parameter names follow MODELS.md section 5 exactly (they are the module paths,
so `state_dict()` keys are the safetensors tensor names), e.g.
`model.layers.0.self_attn.q_proj.weight`. Only the baseline configuration is
supported: value_residual "none", residual "standard" and no MoE.

Needs only torch (written against 1.13) and the standard library.
"""

import dataclasses
import math
from typing import Any, Dict, Mapping, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

# Config fields of MODELS.md section 1 that this reference implements.
_MODEL_FIELDS = (
    'vocab_size', 'hidden_size', 'intermediate_size', 'num_hidden_layers',
    'num_attention_heads', 'num_key_value_heads', 'max_position_embeddings',
    'rope_theta', 'rms_norm_eps', 'tie_word_embeddings', 'qk_norm',
    'initializer_range')

# Section 1 fields that select variants this reference does not implement,
# each with the only value accepted (the baseline's).
_BASELINE_ONLY_FIELDS = {
    'value_residual': 'none',
    'residual': 'standard',
    'moe': None,
}

# Section 1 fields that only matter for those variants; ignored here.
_IGNORED_FIELDS = ('resformer_mode', 'block_size', 'dar_variant',
                   'hc_streams')


@dataclasses.dataclass
class ModelConfig:
    """Baseline model hyper-parameters (MODELS.md section 1).

    Attributes:
        vocab_size: V, number of token ids.
        hidden_size: d, model width.
        intermediate_size: dff, width of the SwiGLU MLP.
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

    def __post_init__(self):
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        self.validate()

    @property
    def head_dim(self) -> int:
        """dh = d / H."""
        return self.hidden_size // self.num_attention_heads

    def validate(self) -> None:
        """Raises ValueError naming the field of an impossible config."""
        positive = ('vocab_size', 'hidden_size', 'intermediate_size',
                    'num_hidden_layers', 'num_attention_heads',
                    'num_key_value_heads', 'max_position_embeddings')
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

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> 'ModelConfig':
        """Builds a config from a Hugging Face style JSON object.

        Args:
            raw: the parsed config JSON.

        Returns:
            The config.

        Raises:
            ValueError: a field is unknown, or selects a variant that this
                baseline reference does not implement.
        """
        kwargs = {}
        for key, value in raw.items():
            if key in _MODEL_FIELDS:
                kwargs[key] = value
            elif key in _BASELINE_ONLY_FIELDS:
                if value != _BASELINE_ONLY_FIELDS[key]:
                    raise ValueError(f'{key}={value!r} is not supported by '
                                     'the baseline reference')
            elif key not in _IGNORED_FIELDS:
                raise ValueError(f'unknown config field {key!r}')
        return cls(**kwargs)

    def to_dict(self) -> Dict[str, Any]:
        """Returns the config as a JSON-ready dict (section 1 field names)."""
        return dataclasses.asdict(self)


def rms_norm(x: torch.Tensor, weight: torch.Tensor,
             eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension: weight * x / sqrt(mean(x^2) + eps).

    fp16/bf16 inputs are normalised in float32 as MODELS.md asks; float32 and
    float64 inputs are normalised in their own precision.

    Args:
        x: input, [..., D].
        weight: gain, [D].
        eps: epsilon added to the mean square.

    Returns:
        The normalised tensor, same shape and dtype as x.
    """
    low_precision = x.dtype in (torch.float16, torch.bfloat16)
    compute = x.float() if low_precision else x
    inv_rms = torch.rsqrt(compute.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (compute * inv_rms).to(x.dtype) * weight


def rope_tables(seq_len: int, head_dim: int, theta: float,
                dtype: torch.dtype,
                device: Optional[torch.device] = None
                ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Cos/sin tables of Hugging Face Llama RoPE for positions 0..T-1.

    inv_freq_i = theta^(-2i/dh) for i < dh/2 and angle(t, i) = t * inv_freq_i.
    The angles are computed in float64 (as satdar does) and only then cast.

    Args:
        seq_len: T.
        head_dim: dh (even).
        theta: RoPE base.
        dtype: dtype of the returned tables.
        device: device of the returned tables.

    Returns:
        (cos, sin), each [T, dh], the dh/2 angles repeated over both halves.
    """
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim
    inv_freq = theta ** (-exponents)
    positions = torch.arange(seq_len, dtype=torch.float64)
    angles = torch.outer(positions, inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    return (angles.cos().to(dtype=dtype, device=device),
            angles.sin().to(dtype=dtype, device=device))


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """Maps [x1, x2] (the halves of the last dimension) to [-x2, x1]."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor,
               sin: torch.Tensor) -> torch.Tensor:
    """Rotates x [..., T, dh]: x * cos + rotate_half(x) * sin."""
    return x * cos + rotate_half(x) * sin


def causal_mask(seq_len: int, dtype: torch.dtype,
                device: Optional[torch.device] = None) -> torch.Tensor:
    """Additive [T, T] mask: 0 where key <= query, -inf above the diagonal."""
    mask = torch.full((seq_len, seq_len), float('-inf'), dtype=dtype,
                      device=device)
    return torch.triu(mask, diagonal=1)


class RMSNorm(nn.Module):
    """RMSNorm with a learnable gain named `weight`."""

    def __init__(self, dim: int, eps: float, dtype: torch.dtype):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class Attention(nn.Module):
    """Causal multi-head attention with GQA, optional QK-norm and RoPE."""

    def __init__(self, config: ModelConfig, dtype: torch.dtype):
        super().__init__()
        d, dh = config.hidden_size, config.head_dim
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

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        """Computes the attention sublayer output a = O Wo^T.

        Args:
            x: normalised input, [B, T, d].
            cos: RoPE cos table, [T, dh].
            sin: RoPE sin table, [T, dh].
            mask: additive causal mask, [T, T].

        Returns:
            [B, T, d].
        """
        b, t, _ = x.shape
        h, n, dh = self.num_heads, self.num_kv_heads, self.head_dim
        q = self.q_proj(x).view(b, t, h, dh)
        k = self.k_proj(x).view(b, t, n, dh)
        v = self.v_proj(x).view(b, t, n, dh)
        if self.q_norm is not None:
            q = self.q_norm(q)
            k = self.k_norm(k)
        # Heads first, [B, heads, T, dh]. V is never rotated.
        q = apply_rope(q.transpose(1, 2), cos, sin)
        k = apply_rope(k.transpose(1, 2), cos, sin)
        v = v.transpose(1, 2)
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
        scores = scores.mul_(1.0 / math.sqrt(dh)).add_(mask)
        probs = torch.softmax(scores, dim=-1)
        out = torch.matmul(probs, v)  # [B, N, rep, T, dh]
        out = out.reshape(b, h, t, dh).transpose(1, 2).reshape(b, t, h * dh)
        return self.o_proj(out)


class MLP(nn.Module):
    """SwiGLU MLP: down(silu(gate z) * up z)."""

    def __init__(self, config: ModelConfig, dtype: torch.dtype):
        super().__init__()
        d, dff = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(d, dff, bias=False, dtype=dtype)
        self.up_proj = nn.Linear(d, dff, bias=False, dtype=dtype)
        self.down_proj = nn.Linear(dff, d, bias=False, dtype=dtype)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(z)) * self.up_proj(z))


class DecoderLayer(nn.Module):
    """Pre-norm block: h' = h + attn(norm(h)); out = h' + mlp(norm(h'))."""

    def __init__(self, config: ModelConfig, dtype: torch.dtype):
        super().__init__()
        d, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = RMSNorm(d, eps, dtype)
        self.self_attn = Attention(config, dtype)
        self.post_attention_layernorm = RMSNorm(d, eps, dtype)
        self.mlp = MLP(config, dtype)

    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class Backbone(nn.Module):
    """Embedding, decoder layers and final norm (the `model.` prefix)."""

    def __init__(self, config: ModelConfig, dtype: torch.dtype):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size,
                                         config.hidden_size, dtype=dtype)
        self.layers = nn.ModuleList(
            DecoderLayer(config, dtype)
            for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Returns the final normalised hidden states, [B, T, d]."""
        config = self.config
        t = input_ids.shape[1]
        if t > config.max_position_embeddings:
            raise ValueError(f'sequence length {t} exceeds '
                             'max_position_embeddings '
                             f'{config.max_position_embeddings}')
        h = self.embed_tokens(input_ids.long())
        cos, sin = rope_tables(t, config.head_dim, config.rope_theta,
                               h.dtype, h.device)
        mask = causal_mask(t, h.dtype, h.device)
        for layer in self.layers:
            h = layer(h, cos, sin, mask)
        return self.norm(h)


class CausalLM(nn.Module):
    """The baseline decoder with its LM head and next-token loss.

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

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Returns logits [B, T, V] for ids [B, T] of any integer dtype."""
        return torch.matmul(self.model(input_ids), self.output_weight().t())

    def loss(self, tokens: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy of a [B, T+1] token batch.

        The logits at position t (computed from tokens[:, :T]) are scored
        against tokens[:, t+1] and averaged over all B*T positions.

        Args:
            tokens: integer ids, [B, T+1].

        Returns:
            The scalar loss, in the model dtype.
        """
        logits = self(tokens[:, :-1])
        targets = tokens[:, 1:].long()
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                               targets.reshape(-1))


@torch.no_grad()
def init_weights(model: CausalLM, std: float,
                 generator: Optional[torch.Generator] = None,
                 gain_std: float = 0.0) -> None:
    """Initialises every parameter, in named_parameters() order.

    Matrices (2-D: the linears and the embedding) get N(0, std); norm gains
    (1-D) get 1 + gain_std * N(0, 1), i.e. exactly 1 for gain_std = 0.

    Args:
        model: the model to initialise in place.
        std: standard deviation of the matrices (initializer_range).
        generator: random source; None uses torch's global generator.
        gain_std: spread of the norm gains around 1.
    """
    for _, param in model.named_parameters():
        if param.dim() >= 2:
            param.normal_(0.0, std, generator=generator)
        elif gain_std:
            param.normal_(1.0, gain_std, generator=generator)
        else:
            param.fill_(1.0)
