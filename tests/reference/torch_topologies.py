"""PyTorch reference of the residual topologies (MODELS.md section 4).

Implements AttnRes, Transparent Attention and DAR as the contract
(shared/spec/MODELS.md) defines them and HC, mHC, DenseFormer and MUDDFormer as docs/MODELS.md defines them,
with the parameter names, shapes and initial values of those two documents.

The topology decides what each sublayer reads and what the final norm reads;
the sublayers themselves ("branches" f_l, each with its own pre-norm) belong
to the decoder layers of torch_model.py. Sublayers are numbered l = 1..2L:
the attention of layer i (0-based) is l = 2i + 1, its MLP l = 2i + 2. The
runners only assume that a layer has:

  * attn_branch(u, state) and mlp_branch(u, state): f_l(u);
  * input_layernorm, post_attention_layernorm and
    attention(x_q, state, x_k, x_v) (normalised inputs; MUDDFormer);
  * the topology modules made by `layer_modules`, as attributes.

All mixing math runs in the model dtype (float32 for fp16/bf16 models).

Needs only torch (written against 1.13).
"""

import math
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

import torch_layers

RESIDUALS = ('standard', 'attnres', 'transparent', 'dar', 'hc', 'mhc',
             'denseformer', 'muddformer')

# DAR: dar_variant -> ((key(0), key(1)), (val(0), val(1))), the streams whose
# history gives the keys and the values of the retrieval for stream s.
DAR_VARIANTS = {
    'cross': ((1, 0), (0, 1)),
    'self_kv': ((0, 1), (0, 1)),
    'cross_v': ((0, 1), (1, 0)),
    'fixed_kv': ((0, 0), (1, 1)),
}

# Sinkhorn normalisations of mHC: 20 column and 19 row normalisations.
SINKHORN_ITERATIONS = 20

# MUDDFormer: the width K of the hidden layer is C*S rounded up to this.
MUDD_HIDDEN_MULTIPLE = 64


def _param(dtype: torch.dtype, *shape: int) -> nn.Parameter:
    return nn.Parameter(torch.zeros(*shape, dtype=dtype))


def _retrieve(query: torch.Tensor, keys: torch.Tensor,
              values: torch.Tensor) -> torch.Tensor:
    """sum_i softmax_i(query . keys_i) values_i over the leading axis.

    Args:
        query: [d].
        keys: normalised sources, [S, B, T, d].
        values: sources, [S, B, T, d].

    Returns:
        [B, T, d].
    """
    weights = torch.softmax(torch.matmul(keys, query), dim=0)  # [S, B, T]
    return (weights.unsqueeze(-1) * values).sum(dim=0)


# ---------------------------------------------------------------------------
# AttnRes
# ---------------------------------------------------------------------------


class AttnResRetrieval(torch_layers.MixingModule):
    """`{attn,mlp}_res`, `final_res`: query [d] (init 0), norm [d] (init 1)."""

    def __init__(self, d: int, eps: float, dtype: torch.dtype):
        super().__init__()
        self.query = _param(dtype, d)
        self.norm = torch_layers.RMSNorm(d, eps, dtype)
        self.reset_mixing()

    @torch.no_grad()
    def reset_mixing(self) -> None:
        self.query.zero_()

    def forward(self, sources: List[torch.Tensor]) -> torch.Tensor:
        """u = sum_i softmax_i(w . RMSNorm(X_i; k)) X_i."""
        stacked = torch.stack(sources)
        return _retrieve(self.query, self.norm(stacked), stacked)


def run_attnres(layers: nn.ModuleList, final: AttnResRetrieval,
                h0: torch.Tensor, state: Any,
                block_size: int) -> torch.Tensor:
    """AttnRes: returns u of the final readout (input of the final norm)."""
    sources, partial = [h0], None
    for l, layer, kind in sublayers(layers):
        current = sources + ([partial] if partial is not None else [])
        u = getattr(layer, kind + '_res')(current)
        y = layer_branch(layer, kind)(u, state)
        partial = y if partial is None else partial + y
        if l % block_size == 0:
            sources.append(partial)
            partial = None
    return final(sources + ([partial] if partial is not None else []))


# ---------------------------------------------------------------------------
# Transparent Attention
# ---------------------------------------------------------------------------


def transparent_sources(l: int, block_size: int) -> int:
    """|X| at sublayer l (1-based; 2L + 1 is the final readout)."""
    return 1 + (l - 1) // block_size + (1 if (l - 1) % block_size else 0)


class TransparentMix(torch_layers.MixingModule):
    """`{attn,mlp}_res`, `final_res` of transparent: logits [|X|] (init 0)."""

    def __init__(self, num_sources: int, dtype: torch.dtype):
        super().__init__()
        self.logits = _param(dtype, num_sources)
        self.reset_mixing()

    @torch.no_grad()
    def reset_mixing(self) -> None:
        self.logits.zero_()

    def forward(self, sources: List[torch.Tensor]) -> torch.Tensor:
        """u = sum_i softmax(z)_i X_i, the same weights for every token."""
        if len(sources) != self.logits.shape[0]:
            raise ValueError(f'{len(sources)} sources for '
                             f'{self.logits.shape[0]} logits')
        weights = torch.softmax(self.logits, dim=0)
        return torch.einsum('s,sbtd->btd', weights, torch.stack(sources))


def run_transparent(layers: nn.ModuleList, final: TransparentMix,
                    h0: torch.Tensor, state: Any,
                    block_size: int) -> torch.Tensor:
    """Transparent Attention: AttnRes' sources and partial sums mixed with
    static softmax weights; returns u of the final readout."""
    sources, partial = [h0], None
    for l, layer, kind in sublayers(layers):
        current = sources + ([partial] if partial is not None else [])
        if l == 1:
            u = h0  # |X| = 1: h_0 as it is, no logits
        else:
            u = getattr(layer, kind + '_res')(current)
        y = layer_branch(layer, kind)(u, state)
        partial = y if partial is None else partial + y
        if l % block_size == 0:
            sources.append(partial)
            partial = None
    return final(sources + ([partial] if partial is not None else []))


# ---------------------------------------------------------------------------
# DAR
# ---------------------------------------------------------------------------


class DarSublayer(torch_layers.MixingModule):
    """`{attn,mlp}_dar` / `final_dar`: two-stream retrieval, mix and write.

    query [2, d] (row s = w^s, init 0), norm [d] (init 1, shared by both
    streams), mix [2] (init 0); sublayers also have transport [1] (t_l,
    init 2) and write [2] (v_l^s, init +2 if s == l % 2 else -2).
    """

    def __init__(self, d: int, eps: float, dtype: torch.dtype,
                 sublayer: Optional[int]):
        """sublayer: l (1-based), or None for the final readout."""
        super().__init__()
        self.sublayer = sublayer
        self.query = _param(dtype, 2, d)
        self.norm = torch_layers.RMSNorm(d, eps, dtype)
        self.mix = _param(dtype, 2)
        if sublayer is not None:
            self.transport = _param(dtype, 1)
            self.write = _param(dtype, 2)
        self.reset_mixing()

    @torch.no_grad()
    def reset_mixing(self) -> None:
        self.query.zero_()
        self.mix.zero_()
        if self.sublayer is not None:
            self.transport.fill_(2.0)
            parity = self.sublayer % 2
            self.write.copy_(torch.tensor(
                [2.0 if s == parity else -2.0 for s in range(2)]))

    def retrieve(self, streams: Tuple[List[torch.Tensor], List[torch.Tensor]],
                 variant: str) -> torch.Tensor:
        """u = c^0 r^0 + c^1 r^1 over the two streams' entries.

        Args:
            streams: (X^0, X^1), the entries of each stream (same length).
            variant: dar_variant, selecting key(s) and val(s).

        Returns:
            [B, T, d].
        """
        stacked = [torch.stack(x) for x in streams]
        keys = [self.norm(x) for x in stacked]
        key_of, val_of = DAR_VARIANTS[variant]
        mix = torch.softmax(self.mix, dim=0)
        u = 0
        for s in range(2):
            r = _retrieve(self.query[s], keys[key_of[s]], stacked[val_of[s]])
            u = u + mix[s] * r
        return u

    def write_partials(self, partials: Tuple[Optional[torch.Tensor], ...],
                       y: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Returns the new (P^0, P^1); an empty P (None) counts as 0."""
        rho = torch.sigmoid(self.transport[0])
        beta = 2 * torch.sigmoid(self.write)
        p0, p1 = partials
        if p0 is None:  # First sublayer of a block: both streams empty.
            return beta[0] * y, beta[1] * y
        return (rho * p0 + (1 - rho) * p1 + beta[0] * y,
                (1 - rho) * p0 + rho * p1 + beta[1] * y)


def run_dar(layers: nn.ModuleList, final: DarSublayer, h0: torch.Tensor,
            state: Any, block_size: int, variant: str) -> torch.Tensor:
    """DAR: returns u of the final readout (input of the final norm)."""
    history = ([h0], [h0])
    partials = (None, None)
    for l, layer, kind in sublayers(layers):
        dar = getattr(layer, kind + '_dar')
        u = dar.retrieve(_with_partials(history, partials), variant)
        y = layer_branch(layer, kind)(u, state)
        partials = dar.write_partials(partials, y)
        if l % block_size == 0:
            for s in range(2):
                history[s].append(partials[s])
            partials = (None, None)
    return final.retrieve(_with_partials(history, partials), variant)


def _with_partials(history, partials):
    """X^s = S^s + [P^s] if P^s is not empty."""
    if partials[0] is None:
        return history
    return tuple(h + [p] for h, p in zip(history, partials))


# ---------------------------------------------------------------------------
# HC and mHC
# ---------------------------------------------------------------------------


class HyperConnection(torch_layers.MixingModule):
    """`{attn,mlp}_hc`: dynamic Hyper-Connections of sublayer l.

    Parameters (docs/MODELS.md): norm [d] (1), static_alpha [n, n+1]
    (column 0 = e_{(l-1) mod n}, columns 1..n = I), static_beta [n] (1),
    dynamic_alpha [n+1, d] (0), dynamic_beta [1, d] (0), alpha_scale [1]
    (0.01), beta_scale [1] (0.01).
    """

    def __init__(self, d: int, n: int, sublayer: int, eps: float,
                 dtype: torch.dtype):
        super().__init__()
        self.n, self.sublayer = n, sublayer
        self.norm = torch_layers.RMSNorm(d, eps, dtype)
        self.static_alpha = _param(dtype, n, n + 1)
        self.static_beta = _param(dtype, n)
        self.dynamic_alpha = _param(dtype, n + 1, d)
        self.dynamic_beta = _param(dtype, 1, d)
        self.alpha_scale = _param(dtype, 1)
        self.beta_scale = _param(dtype, 1)
        self.reset_mixing()

    @torch.no_grad()
    def reset_mixing(self) -> None:
        n = self.n
        self.static_alpha.zero_()
        self.static_alpha[(self.sublayer - 1) % n, 0] = 1.0
        self.static_alpha[:, 1:] = torch.eye(n)
        self.static_beta.fill_(1.0)
        self.dynamic_alpha.zero_()
        self.dynamic_beta.zero_()
        self.alpha_scale.fill_(0.01)
        self.beta_scale.fill_(0.01)

    def read(self, hyper: torch.Tensor, trace: Optional[dict] = None
             ) -> Tuple[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
        """Sublayer input h_in from the hyper hidden state.

        Args:
            hyper: H, [n, B, T, d].
            trace: unused (the interface of ManifoldHyperConnection.read).

        Returns:
            (h_in [B, T, d], (A_r [n(j), B, T, n(m)], B [n, B, T])), the
            second item for write().
        """
        normed = self.norm(hyper)
        alpha = (self.alpha_scale * torch.tanh(
            torch.matmul(normed, self.dynamic_alpha.t())) +
                 self.static_alpha[:, None, None, :])  # [n, B, T, n+1]
        beta = (self.beta_scale * torch.tanh(
            torch.matmul(normed, self.dynamic_beta.t()))[..., 0] +
                self.static_beta[:, None, None])  # [n, B, T]
        h_in = (alpha[..., 0].unsqueeze(-1) * hyper).sum(dim=0)
        return h_in, (alpha[..., 1:], beta)

    def write(self, hyper: torch.Tensor, y: torch.Tensor,
              coefficients: Tuple[torch.Tensor, torch.Tensor]
              ) -> torch.Tensor:
        """H'_m = B[m] y + sum_j A_r[j, m] H_j."""
        mix, beta = coefficients
        carried = torch.einsum('jbtm,jbtd->mbtd', mix, hyper)
        return beta.unsqueeze(-1) * y + carried


class ManifoldHyperConnection(torch_layers.MixingModule):
    """`{attn,mlp}_mhc`: mHC with a Sinkhorn-projected residual mixing.

    Parameters (docs/MODELS.md): fn [n(n+2), n d] (N(0, std)), scale [3]
    (0.01 each), base [n(n+2)] (pre -log(n-1), post 0, res 4 I).
    """
    MATRIX_PARAMS = ('fn',)

    def __init__(self, d: int, n: int, eps: float, dtype: torch.dtype):
        super().__init__()
        self.n, self.eps = n, eps
        self.fn = _param(dtype, n * (n + 2), n * d)
        self.scale = _param(dtype, 3)
        self.base = _param(dtype, n * (n + 2))
        self.reset_mixing()

    @torch.no_grad()
    def reset_mixing(self) -> None:
        n = self.n
        self.scale.fill_(0.01)
        self.base.zero_()
        self.base[:n] = -math.log(n - 1) if n > 1 else 0.0
        self.base[2 * n:] = (4.0 * torch.eye(n)).reshape(-1)

    def coefficients(self, hyper: torch.Tensor,
                     trace: Optional[dict] = None
                     ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(pre [B, T, n], post [B, T, n], M [B, T, n(j), n(m)]) per token.

        Args:
            hyper: H, [n, B, T, d].
            trace: if given, M is appended to trace['sinkhorn'].
        """
        n = self.n
        x = hyper.permute(1, 2, 0, 3).flatten(2)  # vec(H) = [H_0 .. H_n-1]
        x = x.to(torch_layers.compute_dtype(x.dtype))
        inv_rms = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        mixes = torch.matmul(x, self.fn.to(x.dtype).t()) * inv_rms
        pre = torch.sigmoid(self.scale[0] * mixes[..., :n] + self.base[:n])
        post = 2 * torch.sigmoid(self.scale[1] * mixes[..., n:2 * n] +
                                 self.base[n:2 * n])
        logits = self.scale[2] * mixes[..., 2 * n:] + self.base[2 * n:]
        matrix = sinkhorn(logits.reshape(*logits.shape[:-1], n, n))
        if trace is not None:
            trace.setdefault('sinkhorn', []).append(matrix.detach())
        return pre, post, matrix

    def read(self, hyper: torch.Tensor, trace: Optional[dict] = None):
        """(h_in [B, T, d], coefficients for write()); see coefficients()."""
        pre, post, matrix = self.coefficients(hyper, trace)
        h_in = torch.einsum('btj,jbtd->btd', pre.to(hyper.dtype), hyper)
        return h_in, (post, matrix)

    def write(self, hyper: torch.Tensor, y: torch.Tensor,
              coefficients) -> torch.Tensor:
        """H'_m = post_m y + sum_j M[j, m] H_j."""
        post, matrix = (c.to(hyper.dtype) for c in coefficients)
        carried = torch.einsum('btjm,jbtd->mbtd', matrix, hyper)
        return post.permute(2, 0, 1).unsqueeze(-1) * y + carried


def sinkhorn(logits: torch.Tensor) -> torch.Tensor:
    """Row softmax, then alternate column and row normalisations.

    Args:
        logits: R, [..., n(j), n(m)].

    Returns:
        M after SINKHORN_ITERATIONS column normalisations (the last step),
        with SINKHORN_ITERATIONS - 1 row normalisations between them.
    """
    matrix = torch.softmax(logits, dim=-1)
    matrix = matrix / matrix.sum(dim=-2, keepdim=True)
    for _ in range(SINKHORN_ITERATIONS - 1):
        matrix = matrix / matrix.sum(dim=-1, keepdim=True)
        matrix = matrix / matrix.sum(dim=-2, keepdim=True)
    return matrix


def run_hyper(layers: nn.ModuleList, h0: torch.Tensor, state: Any, n: int,
              suffix: str) -> torch.Tensor:
    """HC (suffix 'hc') or mHC ('mhc'): returns x_final = sum_j H_j."""
    hyper = h0.unsqueeze(0).expand(n, *h0.shape)
    for _, layer, kind in sublayers(layers):
        connection = getattr(layer, f'{kind}_{suffix}')
        h_in, coefficients = connection.read(hyper, state.trace)
        y = layer_branch(layer, kind)(h_in, state)
        hyper = connection.write(hyper, y, coefficients)
    return hyper.sum(dim=0)


# ---------------------------------------------------------------------------
# DenseFormer and MUDDFormer
# ---------------------------------------------------------------------------


class DepthWeightedAverage(torch_layers.MixingModule):
    """`dwa` of layer i: weight [i+2], init one-hot at j = i+1."""

    def __init__(self, num_sources: int, dtype: torch.dtype):
        super().__init__()
        self.weight = _param(dtype, num_sources)
        self.reset_mixing()

    @torch.no_grad()
    def reset_mixing(self) -> None:
        self.weight.zero_()
        self.weight[-1] = 1.0

    def forward(self, sources: List[torch.Tensor]) -> torch.Tensor:
        """Y_i = sum_j alpha_{i,j} X_j."""
        return torch.einsum('s,sbtd->btd', self.weight, torch.stack(sources))


def run_denseformer(layers: nn.ModuleList, h0: torch.Tensor,
                    state: Any) -> torch.Tensor:
    """DenseFormer: returns x_final = Y_{L-1}."""
    sources, y = [h0], h0
    for layer in layers:
        x = y + layer.attn_branch(y, state)
        x = x + layer.mlp_branch(x, state)
        sources.append(x)
        y = layer.dwa(sources)
    return y


class MuddConnection(torch_layers.MixingModule):
    """`mudd` of layer i: the dense connection after block i, and the K/V
    pre-norms of block i's attention.

    With S = i+2 sources and C = 4 ways (Q, K, V, R; C = 1, R only, after
    the last block): w1 [K, d] (N(0, std); K = C*S rounded up to a multiple
    of 64), w2 [C*S, K] (0; row c*S + j), static [C, S] (1 at j = i+1),
    k_norm [d] and v_norm [d] (1).
    """
    MATRIX_PARAMS = ('w1',)
    # Random test weights: w2 sums K = 64 terms; keep A's spread moderate.
    NOISE_SCALE = {'w2': 1.0 / 6.0}

    def __init__(self, d: int, layer_index: int, num_layers: int,
                 eps: float, dtype: torch.dtype):
        super().__init__()
        self.eps = eps
        self.num_sources = layer_index + 2
        self.num_ways = 4 if layer_index < num_layers - 1 else 1
        cs = self.num_ways * self.num_sources
        hidden = -(-cs // MUDD_HIDDEN_MULTIPLE) * MUDD_HIDDEN_MULTIPLE
        self.w1 = _param(dtype, hidden, d)
        self.w2 = _param(dtype, cs, hidden)
        self.static = _param(dtype, self.num_ways, self.num_sources)
        self.k_norm = torch_layers.RMSNorm(d, eps, dtype)
        self.v_norm = torch_layers.RMSNorm(d, eps, dtype)
        self.reset_mixing()

    @torch.no_grad()
    def reset_mixing(self) -> None:
        self.w2.zero_()
        self.static.zero_()
        self.static[:, -1] = 1.0

    def forward(self, sources: List[torch.Tensor]) -> List[torch.Tensor]:
        """Ways X^c = sum_j A[c, j] X_j, A = w2 gelu(w1 RMS(X_last)) + static.

        Args:
            sources: X_0 .. X_{i+1}, each [B, T, d].

        Returns:
            C tensors [B, T, d]: (X^Q, X^K, X^V, X^R), or (X^R,).
        """
        last = torch_layers.rms_normalize(sources[-1], self.eps)
        hidden = F.gelu(torch.matmul(last, self.w1.t()))  # erf form
        dynamic = torch.matmul(hidden, self.w2.t())
        weights = (dynamic.reshape(*dynamic.shape[:-1], self.num_ways,
                                   self.num_sources) + self.static)
        ways = torch.einsum('btcs,sbtd->cbtd', weights, torch.stack(sources))
        return list(ways.unbind(0))


def run_muddformer(layers: nn.ModuleList, h0: torch.Tensor,
                   state: Any) -> torch.Tensor:
    """MUDDFormer: returns x_final = X^R after the last block."""
    sources = [h0]
    x_q = x_k = x_v = x_r = h0
    for layer in layers:
        x_a = x_r + layer.attention(layer.input_layernorm(x_q), state,
                                    layer.mudd.k_norm(x_k),
                                    layer.mudd.v_norm(x_v))
        sources.append(x_a + layer.mlp_branch(x_a, state))
        ways = layer.mudd(sources)
        if len(ways) == 4:
            x_q, x_k, x_v, x_r = ways
        else:
            (x_r,) = ways
    return x_r


# ---------------------------------------------------------------------------
# Construction and dispatch
# ---------------------------------------------------------------------------


def sublayers(layers: nn.ModuleList) -> Iterator[Tuple[int, nn.Module, str]]:
    """Yields (l, layer, 'attn' | 'mlp') for l = 1..2L."""
    for i, layer in enumerate(layers):
        yield 2 * i + 1, layer, 'attn'
        yield 2 * i + 2, layer, 'mlp'


def layer_branch(layer: nn.Module, kind: str) -> Callable:
    """f_l of a sublayer: layer.attn_branch or layer.mlp_branch."""
    return layer.attn_branch if kind == 'attn' else layer.mlp_branch


def layer_modules(config: Any, layer_index: int,
                  dtype: torch.dtype) -> Dict[str, nn.Module]:
    """Topology modules of decoder layer i, by attribute name.

    Args:
        config: the model config (torch_model.ModelConfig).
        layer_index: i, 0-based.
        dtype: parameter dtype.

    Returns:
        e.g. {'attn_res': ..., 'mlp_res': ...}; empty for "standard".
    """
    d, eps, n = config.hidden_size, config.rms_norm_eps, config.hc_streams
    residual = config.residual
    modules = {}
    for offset, kind in enumerate(('attn', 'mlp')):
        l = 2 * layer_index + 1 + offset
        if residual == 'attnres':
            modules[kind + '_res'] = AttnResRetrieval(d, eps, dtype)
        elif residual == 'transparent' and l > 1:
            modules[kind + '_res'] = TransparentMix(
                transparent_sources(l, config.effective_block_size), dtype)
        elif residual == 'dar':
            modules[kind + '_dar'] = DarSublayer(d, eps, dtype, l)
        elif residual == 'hc':
            modules[kind + '_hc'] = HyperConnection(d, n, l, eps, dtype)
        elif residual == 'mhc':
            modules[kind + '_mhc'] = ManifoldHyperConnection(d, n, eps,
                                                             dtype)
    if residual == 'denseformer':
        modules['dwa'] = DepthWeightedAverage(layer_index + 2, dtype)
    elif residual == 'muddformer':
        modules['mudd'] = MuddConnection(d, layer_index,
                                         config.num_hidden_layers, eps, dtype)
    return modules


def final_modules(config: Any, dtype: torch.dtype) -> Dict[str, nn.Module]:
    """Backbone-level topology modules: final_res or final_dar."""
    d, eps = config.hidden_size, config.rms_norm_eps
    if config.residual == 'attnres':
        return {'final_res': AttnResRetrieval(d, eps, dtype)}
    if config.residual == 'transparent':
        final = 2 * config.num_hidden_layers + 1
        return {'final_res': TransparentMix(
            transparent_sources(final, config.effective_block_size), dtype)}
    if config.residual == 'dar':
        return {'final_dar': DarSublayer(d, eps, dtype, None)}
    return {}


def run_topology(config: Any, backbone: nn.Module, h0: torch.Tensor,
                 state: Any) -> torch.Tensor:
    """Runs every sublayer; returns the input of the final RMSNorm.

    Args:
        config: the model config.
        backbone: has `layers` and the modules of final_modules().
        h0: embeddings, [B, T, d].
        state: per-forward state passed to the branches (has `trace`).

    Returns:
        [B, T, d].
    """
    layers, residual = backbone.layers, config.residual
    if residual == 'standard':
        h = h0
        for layer in layers:
            h = h + layer.attn_branch(h, state)
            h = h + layer.mlp_branch(h, state)
        return h
    if residual == 'attnres':
        return run_attnres(layers, backbone.final_res, h0, state,
                           config.effective_block_size)
    if residual == 'transparent':
        return run_transparent(layers, backbone.final_res, h0, state,
                               config.effective_block_size)
    if residual == 'dar':
        return run_dar(layers, backbone.final_dar, h0, state,
                       config.effective_block_size, config.dar_variant)
    if residual in ('hc', 'mhc'):
        return run_hyper(layers, h0, state, config.hc_streams, residual)
    if residual == 'denseformer':
        return run_denseformer(layers, h0, state)
    if residual == 'muddformer':
        return run_muddformer(layers, h0, state)
    raise ValueError(f'unknown residual {residual!r}')
