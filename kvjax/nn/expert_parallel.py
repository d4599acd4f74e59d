"""Expert parallelism: the routed experts spread over one mesh axis (E / ep a device), each MoE
layer's tokens sent to their experts' devices and back with two all-to-alls, under `shard_map`.

GShard's fixed shapes (XLA:CPU has no ragged all-to-all: "HLO opcode `ragged-all-to-all` is not
supported by XLA:CPU ThunkEmitter", jax 0.10.2): each device fills a buffer of E experts x C rows
x D, a token's pick at the slot its order among the device's picks of that expert gives;
C = M_l (the device's tokens: a token picks an expert once) so no token is ever dropped and the
logits are the gathered model's. The buffer's expert axis split ep ways is the dispatch
all-to-all; each device runs its E / ep experts on the ep x C rows it received, and the combine
all-to-all returns them; each token gathers its k rows and weights them. One all-to-all carries
E * C * D * a bytes (`kvjax.analytic.parallel.all_to_all_bytes` at capacity factor E / k).
Letters: M_l local tokens, k picks, E experts (El local), C capacity, D d_model, F moe_d_ff,
R source devices.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from kvjax import kernels
from kvjax.model.config import ModelConfig
from kvjax.nn.layers import act_dtype
from kvjax.nn.mlp import gated_product


def slots(idx_Mk: jax.Array, num_experts: int) -> jax.Array:
    """Each pick's row in its expert's buffer: how many earlier picks (token-major) of this
    device chose the same expert."""
    onehot_XE = jax.nn.one_hot(idx_Mk.reshape(-1), num_experts, dtype=jnp.int32)
    before_XE = jnp.cumsum(onehot_XE, axis=0) - onehot_XE
    return jnp.sum(before_XE * onehot_XE, axis=1).reshape(idx_Mk.shape)


def dispatch_combine(
    cfg: ModelConfig, axis: str, x_MD, route, routers, gate_up_EFD, down_EDF
) -> jax.Array:
    """out [M, D]: each token's k experts' outputs, weighted, with the experts spread over
    `axis` of the context mesh (`jax.set_mesh`). `route(x_MD, routers)` gives each token's
    weights and expert ids; it runs on each device's tokens inside the shard_map (the routers
    replicated), so routing needs no collective."""
    if cfg.router == "topk_sigmoid" or cfg.expert_bias:
        raise NotImplementedError(
            "expert parallelism of Llama 4's input-scaled experts or gpt-oss's expert biases"
        )
    mesh = jax.sharding.get_abstract_mesh()
    E, F = cfg.num_experts, cfg.moe_d_ff

    def local(x_MD, routers, gu_EFD, dn_EDF):
        M, D = x_MD.shape
        w_Mk, idx_Mk = route(x_MD, routers)
        ep = jax.lax.axis_size(axis)
        C = M  # a token picks an expert at most once: no pick is ever dropped
        slot_Mk = slots(idx_Mk, E)
        with jax.named_scope(kernels.MOE_GATE_UP):  # the rows sent: the gather's stage
            rows_MkD = jnp.broadcast_to(x_MD[:, None, :], (*idx_Mk.shape, D))
            buf_ECD = jnp.zeros((E, C, D), x_MD.dtype).at[idx_Mk, slot_Mk].set(rows_MkD)
            got_RECD = jax.lax.all_to_all(buf_ECD.reshape(ep, E // ep, C, D), axis, 0, 0)
        with jax.named_scope(kernels.MOE_GATE_UP):
            gu = gu_EFD if gu_EFD.dtype == act_dtype(cfg) else gu_EFD.astype(act_dtype(cfg))
            gu_RECF = jnp.einsum("RECD,EFD->RECF", got_RECD, gu)
        with jax.named_scope(kernels.MOE_ACT):
            h_RECF = gated_product(cfg, gu_RECF[..., :F], gu_RECF[..., F:])
        with jax.named_scope(kernels.MOE_DOWN):
            dn = dn_EDF if dn_EDF.dtype == act_dtype(cfg) else dn_EDF.astype(act_dtype(cfg))
            y_RECD = jnp.einsum("RECF,EDF->RECD", h_RECF, dn)
        with jax.named_scope(kernels.MOE_COMBINE):
            back_ECD = jax.lax.all_to_all(y_RECD, axis, 0, 0).reshape(E, C, D)
            y_MkD = back_ECD[idx_Mk, slot_Mk]
            return jnp.einsum("MkD,Mk->MD", y_MkD, w_Mk.astype(y_MkD.dtype))

    rows = P(axis)
    return jax.shard_map(
        local,
        mesh=mesh,
        in_specs=(rows, P(), P(axis), P(axis)),
        out_specs=rows,
        check_vma=False,
    )(x_MD, routers, gate_up_EFD, down_EDF)
