"""Building blocks shared by the PyTorch reference modules.

RMSNorm, RoPE, the causal mask and the SwiGLU MLP of MODELS.md section 2,
used by torch_model.py (the decoder), torch_moe.py (the experts) and
torch_topologies.py (the residual topologies). torch_model re-exports them,
so `torch_model.rms_norm` and friends keep working.

Needs only torch (written against 1.13).
"""

from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Precision of norms and mixing math for a model dtype.

    MODELS.md asks for fp32; float64 models compute in float64 (as
    `satdar grad --dtype f64` does), fp16/bf16 models in float32.
    """
    if dtype in (torch.float16, torch.bfloat16):
        return torch.float32
    return dtype


def rms_normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """RMS(x) = x / sqrt(mean(x^2) + eps) over the last dimension, no gain.

    fp16/bf16 inputs are normalised in float32; the result has x's dtype.
    """
    compute = x.to(compute_dtype(x.dtype))
    inv_rms = torch.rsqrt(compute.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (compute * inv_rms).to(x.dtype)


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
    return rms_normalize(x, eps) * weight


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
    """RMSNorm with a learnable gain named `weight` (init 1)."""

    def __init__(self, dim: int, eps: float, dtype: torch.dtype):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class MLP(nn.Module):
    """SwiGLU MLP: down(silu(gate z) * up z)."""

    def __init__(self, hidden_size: int, intermediate_size: int,
                 dtype: torch.dtype):
        super().__init__()
        d, dff = hidden_size, intermediate_size
        self.gate_proj = nn.Linear(d, dff, bias=False, dtype=dtype)
        self.up_proj = nn.Linear(d, dff, bias=False, dtype=dtype)
        self.down_proj = nn.Linear(dff, d, bias=False, dtype=dtype)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(z)) * self.up_proj(z))


class MixingModule(nn.Module):
    """A module whose own parameters have documented, non-random inits.

    torch_model.init_weights gives the parameters named in MATRIX_PARAMS
    N(0, initializer_range) like the linears; every other own parameter is a
    "mixing" parameter (a query, gate, scale, ...) that reset_mixing() sets
    to its documented initial value.

    Attributes:
        MATRIX_PARAMS: own parameters initialised like the linears.
        NOISE_SCALE: per-parameter factor on the spread of random test
            weights around the documented value (default 1).
    """
    MATRIX_PARAMS: Tuple[str, ...] = ()
    NOISE_SCALE: Dict[str, float] = {}

    def reset_mixing(self) -> None:
        """Sets the mixing parameters to their documented initial values."""
        raise NotImplementedError
