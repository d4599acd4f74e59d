"""gpt-oss's checkpoints: MXFP4 expert weights dequantized on load, and its stacked experts.

MXFP4 (OCP Microscaling spec v1.0): blocks of 32 elements, each a 4-bit e2m1 value (two to a
byte, the low nibble first) times one shared e8m0 exponent 2^(s - 127). A checkpoint stores an
expert matrix [E, out, in] as `<name>_blocks` [E, out, in/32, 16] (uint8) and `<name>_scales`
[E, out, in/32] (uint8): 17 bytes a block, the 4.25 bits an element that `kvjax.analytic`
sizes (ModelConfig.expert_weight_dtype='mxfp4'). kvjax's model holds them dequantized.

gpt-oss stores its experts stacked and [in, out]: gate_up_proj [E, D, 2F] with gate and up
interleaved along 2F (gate = [..., ::2], up = [..., 1::2]), down_proj [E, F, D]; MXFP4 ones
come [out, in] before Hugging Face's transpose. kvjax keeps (E, 2F, D) = [gate; up] rows and
(E, D, F).
"""

from __future__ import annotations

import numpy as np

from kvjax.errors import KvjaxError

E2M1_VALUES = np.array(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
    np.float32,
)


def dequantize_mxfp4(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """[..., G, 16] uint8 blocks and [..., G] uint8 exponents to [..., G * 32] float32."""
    blocks, scales = np.asarray(blocks), np.asarray(scales)
    if blocks.shape[:-1] != scales.shape or blocks.shape[-1] != 16:
        raise KvjaxError(
            f"MXFP4 blocks {blocks.shape} and scales {scales.shape} do not match ([..., G, 16] "
            f"and [..., G])"
        )
    blocks = blocks.astype(np.uint8)
    values = np.empty(blocks.shape[:-1] + (32,), np.float32)
    values[..., 0::2] = E2M1_VALUES[blocks & 0x0F]
    values[..., 1::2] = E2M1_VALUES[blocks >> 4]
    exponent = scales.astype(np.int32) - 127
    values = np.ldexp(values, exponent[..., None])
    return values.reshape(blocks.shape[:-2] + (blocks.shape[-2] * 32,))


def _rows_gate_up(w_E2FD: np.ndarray) -> np.ndarray:
    """gpt-oss's interleaved gate/up rows [g0, u0, g1, u1, ...] to kvjax's [gate; up]."""
    return np.concatenate([w_E2FD[:, 0::2], w_E2FD[:, 1::2]], axis=1)


def load_gpt_oss_experts(cfg, moe, tensors, get, put, p: str) -> None:
    """The router (weight and bias) and the experts with their biases, dense or MXFP4."""
    D, E, F = cfg.d_model, cfg.num_experts, cfg.moe_d_ff
    put(moe.router, get(p + "router.weight", (E, D)))
    put(moe.router_logit_bias, get(p + "router.bias", (E,)))
    ex = p + "experts."

    def matrix(name: str, out: int, inp: int) -> np.ndarray:  # [E, out, in]
        if ex + name + "_blocks" in tensors:
            blocks = get(ex + name + "_blocks", (E, out, inp // 32, 16))
            return dequantize_mxfp4(blocks, get(ex + name + "_scales", (E, out, inp // 32)))
        return np.swapaxes(get(ex + name, (E, inp, out)), 1, 2)

    put(moe.expert_gate_up, _rows_gate_up(matrix("gate_up_proj", 2 * F, D)))
    put(moe.expert_down, matrix("down_proj", D, F))
    bias = get(ex + "gate_up_proj_bias", (E, 2 * F))
    put(moe.expert_gate_up_bias, np.concatenate([bias[:, 0::2], bias[:, 1::2]], axis=1))
    put(moe.expert_down_bias, get(ex + "down_proj_bias", (E, D)))
