"""The mixture-of-experts MLP: a router, top-k routing (Mixtral / Qwen3-MoE / DeepSeek-V2's softmax,
DeepSeek-V3's sigmoid with its score-correction bias and group-limited choice), the routed experts
and DeepSeek's shared experts.

Each token's k experts are gathered from the (E, 2F, D) and (E, D, F) weights and applied to it
alone: the FLOPs are exactly the routed ones (2*M*k*D*3F), and the weights read are the M*k picks,
k at B = 1 (the active weights). XLA:CPU lowers `jax.lax.ragged_dot` (the grouped-GEMM form)
to every token against every expert, masked (E/k times the FLOPs and all E experts read at any B;
`experiments/benchmarks/moe_experts.py` times both and a dense form), so the gather is the form
whose trace and clock follow the routing. Its
cost: two tokens sharing an expert read it twice (a grouped kernel would once), the worst case
of `kvjax.analytic.moe`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from kvjax import kernels
from kvjax.model.config import ModelConfig
from kvjax.nn.expert_parallel import dispatch_combine
from kvjax.nn.layers import act_dtype, linear, param, read, weight_dtype
from kvjax.nn.mlp import MLP, gated_product
from kvjax.nn.sharding import DATA, MODEL, constrain


class MoE(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        E, D, F = cfg.num_experts, cfg.d_model, cfg.moe_d_ff
        wd = weight_dtype(cfg)
        self.router = param(rngs, (E, D), D, cfg)
        # DeepSeek-V3's e_score_correction_bias: shifts the choice, not the weights (f32)
        sigmoid = cfg.router == "sigmoid"
        self.router_bias = nnx.Param(jnp.zeros((E,), jnp.float32)) if sigmoid else None
        # gpt-oss: a bias on the router's logits
        self.router_logit_bias = nnx.Param(jnp.zeros((E,), wd)) if cfg.router_bias else None
        self.expert_gate_up = param(rngs, (E, 2 * F, D), D, cfg)
        self.expert_down = param(rngs, (E, D, F), F, cfg)
        # set by kvjax.nn.sharding.shard_model: > 1 when each expert's [gate; up] rows are in tp
        # blocks; a mesh axis name when whole experts are spread over it (expert parallelism)
        self.gate_up_blocks = 1
        self.expert_axis = None
        if cfg.expert_bias:  # gpt-oss: every expert's gate_up (2F) and down (D) biased
            self.expert_gate_up_bias = nnx.Param(jnp.zeros((E, 2 * F), wd))
            self.expert_down_bias = nnx.Param(jnp.zeros((E, D), wd))
        # DeepSeek's shared experts: one dense gated MLP of num_shared_experts x moe_d_ff
        S = cfg.shared_d_ff
        self.shared = _mlp(cfg, S, rngs) if S else None
        # Qwen2-MoE: a sigmoid gate a token on the shared experts' output (1 x D)
        self.shared_gate = param(rngs, (1, D), D, cfg) if cfg.shared_expert_gate else None

    def __call__(self, x_BTD: jax.Array) -> jax.Array:
        cfg = self.cfg
        B, T, D = x_BTD.shape
        F = cfg.moe_d_ff
        x_MD = x_BTD.reshape(B * T, D)
        routers = self._router_params()
        if self.expert_axis is not None:  # routed on each device, inside the shard_map
            out_MD = dispatch_combine(
                cfg,
                self.expert_axis,
                x_MD,
                self._route,
                routers,
                self.expert_gate_up[...],
                self.expert_down[...],
            )
            return self._with_shared(x_BTD, out_MD.reshape(B, T, D))
        weights_Mk, idx_Mk = self._route(x_MD, routers)
        scaled_in = cfg.router == "topk_sigmoid"  # Llama 4: the weights scale the input
        with jax.named_scope(kernels.MOE_GATE_UP):
            w_MkED = read_experts(self.expert_gate_up, idx_Mk, cfg)
            if scaled_in:
                x_MkD = x_MD[:, None, :] * weights_Mk.astype(x_MD.dtype)[:, :, None]
                gu_MkE = jnp.einsum("MkD,MkED->MkE", x_MkD, w_MkED)
            else:
                gu_MkE = experts_gate_up(x_MD, w_MkED)
            if cfg.expert_bias:
                gu_MkE = gu_MkE + read_experts(self.expert_gate_up_bias, idx_Mk, cfg)
        with jax.named_scope(kernels.MOE_ACT):
            n = self.gate_up_blocks
            if n == 1:
                h_MkF = gated_product(cfg, gu_MkE[..., :F], gu_MkE[..., F:])
            else:  # one [gate_d; up_d] block per device (kvjax.nn.sharding)
                M, k = gu_MkE.shape[:2]
                gu = constrain(gu_MkE.reshape(M, k, n, 2, F // n), DATA, None, MODEL, None, None)
                h_MkF = gated_product(cfg, gu[..., 0, :], gu[..., 1, :]).reshape(M, k, F)
        if self.gate_up_blocks > 1 and not (scaled_in or cfg.expert_bias):
            # each expert's width split: weight the k rows first and contract k with F in the
            # product, so the partial sums all-reduced are [M, D], not k times that
            with jax.named_scope(kernels.MOE_DOWN):
                w_MkDF = read_experts(self.expert_down, idx_Mk, cfg)
                hw_MkF = h_MkF * weights_Mk.astype(h_MkF.dtype)[:, :, None]
                out_MD = jnp.einsum("MkF,MkDF->MD", hw_MkF, w_MkDF)
            return self._with_shared(x_BTD, out_MD.reshape(B, T, D))
        with jax.named_scope(kernels.MOE_DOWN):
            y_MkD = experts_down(h_MkF, read_experts(self.expert_down, idx_Mk, cfg))
            if cfg.expert_bias:
                y_MkD = y_MkD + read_experts(self.expert_down_bias, idx_Mk, cfg)
        shared_BTD = self._shared(x_BTD)
        with jax.named_scope(kernels.MOE_COMBINE):
            if scaled_in:  # already weighted: the k outputs summed
                out_MD = jnp.sum(y_MkD, axis=1) if cfg.experts_per_token > 1 else y_MkD[:, 0]
            else:
                out_MD = jnp.einsum("MkD,Mk->MD", y_MkD, weights_Mk.astype(y_MkD.dtype))
            out_BTD = out_MD.reshape(B, T, D)
            if shared_BTD is not None:
                out_BTD = out_BTD + shared_BTD
        return out_BTD

    def _shared(self, x_BTD: jax.Array) -> jax.Array | None:
        shared_BTD = None if self.shared is None else self.shared(x_BTD)
        if self.shared_gate is not None:
            with jax.named_scope(kernels.MOE_SHARED_GATE):
                g_BT1 = jax.nn.sigmoid(linear(x_BTD, read(self.shared_gate, self.cfg)))
                shared_BTD = shared_BTD * g_BT1
        return shared_BTD

    def _with_shared(self, x_BTD: jax.Array, routed_BTD: jax.Array) -> jax.Array:
        shared_BTD = self._shared(x_BTD)
        return routed_BTD if shared_BTD is None else routed_BTD + shared_BTD

    def _router_params(self) -> dict[str, jax.Array]:
        out = {"router": self.router[...]}
        if self.router_logit_bias is not None:
            out["logit_bias"] = self.router_logit_bias[...]
        if self.router_bias is not None:
            out["bias"] = self.router_bias[...]
        return out

    def _route(self, x_MD: jax.Array, routers: dict[str, jax.Array]):
        """(weights [M, k], expert ids [M, k]) of the tokens `x_MD`."""
        with jax.named_scope(kernels.MOE_ROUTER):
            logits = router_logits(x_MD, routers["router"])
            if "logit_bias" in routers:
                logits = logits + routers["logit_bias"].astype(jnp.float32)
        with jax.named_scope(kernels.MOE_TOPK):
            return route(self.cfg, logits, routers.get("bias"))


def _mlp(cfg: ModelConfig, width: int, rngs: nnx.Rngs):
    return MLP(cfg, width, rngs=rngs)


def router_logits(x_MD: jax.Array, w_router) -> jax.Array:
    """f32 logits [M, experts] (as DeepSeek's router: both sides widened to f32)."""
    w = w_router.astype(jnp.float32)
    return jax.lax.dot_general(x_MD.astype(jnp.float32), w, (((1,), (1,)), ((), ())))


def experts_gate_up(x_MD: jax.Array, w_MkED: jax.Array) -> jax.Array:
    """Each token against its k gathered experts' [gate; up] rows: [M, k, 2F]."""
    return jnp.einsum("MD,MkED->MkE", x_MD, w_MkED)


def experts_down(h_MkF: jax.Array, w_MkDF: jax.Array) -> jax.Array:
    return jnp.einsum("MkF,MkDF->MkD", h_MkF, w_MkDF)


def read_experts(w: nnx.Param, idx_Mk: jax.Array, cfg: ModelConfig) -> jax.Array:
    """The picked experts' matrices, (M, k, ...), in the compute dtype (gathered, then widened
    where the weights are 1-byte)."""
    return read_experts_array(w[...], idx_Mk, cfg)


def read_experts_array(w_all: jax.Array, idx_Mk: jax.Array, cfg: ModelConfig) -> jax.Array:
    x = w_all[idx_Mk]
    return x if x.dtype == act_dtype(cfg) else x.astype(act_dtype(cfg))


def route(cfg: ModelConfig, logits: jax.Array, bias_E: jax.Array | None):
    """(weights [M, k] f32, expert ids [M, k]) from f32 router logits, as Hugging Face routes:

    softmax (Mixtral, Qwen3-MoE, DeepSeek-V2): p = softmax(logits) over E; the top k of p (with
    `expert_groups` > 1, DeepSeek-V2's group-limited greedy: only experts of the `topk_groups`
    groups with the largest max p); weights p of the picks, renormalised to sum 1 if
    `norm_topk_prob`; times `routed_scaling_factor`.
    topk_sigmoid (Llama 4): the top k logits, weights their sigmoids, which scale the token's
    input to each expert (not its output) and are not renormalised.
    sigmoid (DeepSeek-V3): s = sigmoid(logits); the choice ranks s + bias, within the
    `topk_groups` groups whose two best s + bias sum highest; weights s of the picks, divided by
    their sum (+ 1e-20) if `norm_topk_prob`; times `routed_scaling_factor`.
    """
    E, k = cfg.num_experts, cfg.experts_per_token
    if cfg.router == "topk_sigmoid":  # Llama 4: the top-k logits, then their sigmoids
        top_Mk, idx_Mk = jax.lax.top_k(logits, k)
        return jax.nn.sigmoid(top_Mk), idx_Mk
    if cfg.router == "sigmoid":
        scores = jax.nn.sigmoid(logits)
        choice = scores + bias_E
    else:
        scores = jax.nn.softmax(logits, axis=-1)
        choice = scores
    groups = cfg.expert_groups
    if groups > 1:
        grouped = choice.reshape(-1, groups, E // groups)
        if cfg.router == "sigmoid":
            group_score = jnp.sum(jax.lax.top_k(grouped, 2)[0], axis=-1)
        else:
            group_score = jnp.max(grouped, axis=-1)
        _, keep = jax.lax.top_k(group_score, cfg.topk_groups)
        mask = (
            jnp.zeros_like(group_score, dtype=jnp.bool_)
            .at[jnp.arange(group_score.shape[0])[:, None], keep]
            .set(True)
        )
        mask_ME = jnp.repeat(mask, E // groups, axis=-1)
        choice = jnp.where(mask_ME, choice, -jnp.inf)
    _, idx_Mk = jax.lax.top_k(choice, k)
    weights_Mk = jnp.take_along_axis(scores, idx_Mk, axis=-1)
    if cfg.norm_topk_prob:
        total = jnp.sum(weights_Mk, axis=-1, keepdims=True)
        if cfg.router == "sigmoid":  # DeepSeek-V3 guards the sum
            total = total + 1e-20
        weights_Mk = weights_Mk / total
    if cfg.routed_scaling_factor != 1.0:
        weights_Mk = weights_Mk * cfg.routed_scaling_factor
    return weights_Mk, idx_Mk
