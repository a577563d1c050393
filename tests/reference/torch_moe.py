"""PyTorch reference of the sparse MoE FFN (MODELS.md section 6).

Token-choice top-k routing, dropless: every token goes to its top_k experts
(ties to the lower expert index), weighted by their router probabilities
(renormalised to sum 1 only when norm_topk_prob); shared experts are added
with weight 1. Each expert is a SwiGLU with expert_intermediate_size. The
layer also returns its auxiliary losses: the sequence-wise load-balancing loss
(DeepSeek-V3 style; the assignment fractions f carry no gradient) and the
router z-loss.

Parameter names (under `model.layers.{i}.mlp.`): `router.weight` [E, d],
`experts.{e}.{gate,up,down}_proj.weight`,
`shared_experts.{j}.{gate,up,down}_proj.weight`.

Needs only torch (written against 1.13).
"""

import dataclasses
from typing import Any, Dict, Mapping, Optional, Tuple

import torch
from torch import nn

import torch_layers


@dataclasses.dataclass
class MoEConfig:
    """The `moe` object of the model config (MODELS.md section 1).

    Attributes:
        num_experts: E, routed experts per layer.
        top_k: experts each token is routed to.
        expert_intermediate_size: SwiGLU width of every (routed or shared)
            expert.
        num_shared_experts: experts every token goes through with weight 1.
        router_aux_loss_coef: weight of the sequence-wise balance loss.
        router_z_loss_coef: weight of the router z-loss.
        norm_topk_prob: renormalise the chosen probabilities to sum 1.
    """
    num_experts: int
    top_k: int
    expert_intermediate_size: int
    num_shared_experts: int = 0
    router_aux_loss_coef: float = 0.01
    router_z_loss_coef: float = 0.001
    norm_topk_prob: bool = False

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """Raises ValueError naming the field of an impossible config."""
        for name in ('num_experts', 'top_k', 'expert_intermediate_size'):
            if getattr(self, name) < 1:
                raise ValueError(f'moe.{name} must be >= 1, '
                                 f'got {getattr(self, name)}')
        if self.top_k > self.num_experts:
            raise ValueError(f'moe.top_k ({self.top_k}) must be <= '
                             f'moe.num_experts ({self.num_experts})')
        if self.num_shared_experts < 0:
            raise ValueError('moe.num_shared_experts must be >= 0')
        for name in ('router_aux_loss_coef', 'router_z_loss_coef'):
            if getattr(self, name) < 0:
                raise ValueError(f'moe.{name} must be >= 0')

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> 'MoEConfig':
        """Builds the config from the JSON object; rejects unknown fields."""
        if not isinstance(raw, Mapping):
            raise ValueError(f'moe must be null or an object, got {raw!r}')
        fields = {f.name for f in dataclasses.fields(cls)}
        for key in raw:
            if key not in fields:
                raise ValueError(f'unknown config field moe.{key}')
        return cls(**raw)


class SparseMoE(nn.Module):
    """Token-choice top-k mixture of SwiGLU experts with aux losses."""

    def __init__(self, hidden_size: int, config: MoEConfig,
                 dtype: torch.dtype):
        super().__init__()
        self.config = config
        d, dff = hidden_size, config.expert_intermediate_size
        self.router = nn.Linear(d, config.num_experts, bias=False,
                                dtype=dtype)
        self.experts = nn.ModuleList(
            torch_layers.MLP(d, dff, dtype)
            for _ in range(config.num_experts))
        self.shared_experts = nn.ModuleList(
            torch_layers.MLP(d, dff, dtype)
            for _ in range(config.num_shared_experts))

    def route(self, z: torch.Tensor
              ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Router logits, probabilities and the chosen experts.

        Args:
            z: normalised input, [B, T, d].

        Returns:
            (logits, probs, chosen): logits and probs [B, T, E] in the router
            precision (float32, or float64 for a float64 model); chosen
            [B, T, top_k] expert ids by decreasing probability, ties to the
            lower index.
        """
        precision = torch_layers.compute_dtype(z.dtype)
        logits = torch.matmul(z.to(precision),
                              self.router.weight.to(precision).t())
        probs = torch.softmax(logits, dim=-1)
        # A stable descending sort keeps equal probabilities in index order.
        order = torch.sort(probs.detach(), dim=-1, descending=True,
                           stable=True).indices
        return logits, probs, order[..., :self.config.top_k]

    def forward(self, z: torch.Tensor,
                trace: Optional[Dict[str, list]] = None
                ) -> Tuple[torch.Tensor, torch.Tensor]:
        """Computes the FFN output and this layer's auxiliary loss.

        Args:
            z: normalised input, [B, T, d].
            trace: if given, the router probabilities [B, T, E] are appended
                to trace['router_probs'].

        Returns:
            (m, aux): m [B, T, d] in z's dtype; aux, a scalar in the router
            precision, = balance loss + z-loss of this layer.
        """
        config = self.config
        b, t, d = z.shape
        logits, probs, chosen = self.route(z)
        if trace is not None:
            trace.setdefault('router_probs', []).append(probs.detach())
        weights = probs.gather(-1, chosen)  # [B, T, k]
        if config.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)

        # Dropless dispatch: expert e sees exactly the tokens that chose it.
        flat_z = z.reshape(b * t, d)
        flat_chosen = chosen.reshape(b * t, config.top_k)
        flat_weights = weights.reshape(b * t, config.top_k).to(z.dtype)
        out = torch.zeros_like(flat_z)
        for e, expert in enumerate(self.experts):
            token, slot = torch.nonzero(flat_chosen == e, as_tuple=True)
            if token.numel() == 0:
                continue
            y = expert(flat_z[token]) * flat_weights[token, slot, None]
            out = out.index_add(0, token, y)
        m = out.reshape(b, t, d)
        for expert in self.shared_experts:
            m = m + expert(z)

        # Sequence-wise balance loss: E * sum_e f_e^b P_e^b, mean over b.
        num_experts = config.num_experts
        counts = torch.zeros(b, num_experts, dtype=probs.dtype,
                             device=probs.device)
        counts.scatter_add_(1, chosen.reshape(b, -1),
                            torch.ones_like(chosen.reshape(b, -1),
                                            dtype=probs.dtype))
        fraction = counts / (t * config.top_k)  # f: a count, no gradient
        mean_prob = probs.mean(dim=1)  # P: [B, E]
        balance = (num_experts * (fraction * mean_prob).sum(dim=-1)).mean()
        z_loss = torch.logsumexp(logits, dim=-1).pow(2).mean()
        aux = (config.router_aux_loss_coef * balance +
               config.router_z_loss_coef * z_loss)
        return m, aux
