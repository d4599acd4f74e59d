"""`kvjax simulate --pp`, `--dp-attention D --ep D` (`kvjax.serving.placed`): the step of a
micro-batch through the stages and of an attention group under expert parallelism by hand, the
copies the simulator runs, and the refusals by flag."""

import json

import pytest

from kvjax.analytic.parallel import Placement, device_config, placed_weight_bytes
from kvjax.analytic.params import weight_bytes
from kvjax.cli.main import main
from kvjax.errors import KvjaxError
from kvjax.hardware import get_chip
from kvjax.model.config import get_model_config
from kvjax.serving import placed
from kvjax.serving.scheduler import Request, Scheduled
from kvjax.serving.step_time import ClosedFormStepTime, PlacedStepTime


def _decodes(n: int, context: int = 101):
    return [Scheduled(Request(i, 0.0, context - 1, 5), 1, context) for i in range(n)]


def test_a_micro_batch_crosses_the_stages_by_hand():
    """llama-2-70b at tp 2, pp 2 on H100s, 3 decodes: the whole model's step on a tp-2 device,
    its all-reduces, and one hop of 3 x 8192 x 2 / 2 bytes (a device's half of the rows): at
    450 GB/s for the bound, at NCCL's 370 GB/s plus 5.9 us for the prediction."""
    cfg, chip = get_model_config("llama-2-70b"), get_chip("h100-sxm")
    inner = PlacedStepTime(ClosedFormStepTime(device_config(cfg, 2), chip), cfg, chip, 2)
    batch = _decodes(3)
    hop = 3 * 8192 * 2 / 2
    bound = placed.PipelinedStepTime(inner, cfg, chip, pp=2, tp=2)
    assert bound(batch) == pytest.approx(inner(batch) + hop / 450e9, rel=1e-12)
    pred = placed.PipelinedStepTime(inner, cfg, chip, pp=2, tp=2, achieved=True)
    assert pred(batch) == pytest.approx(inner(batch) + hop / 370e9 + 5.9e-6, rel=1e-12)
    assert pred.decode_steps([100] * 3, 2)[0] == pytest.approx(pred(batch), rel=1e-12)
    stage = placed.stage_config(cfg, 2)
    assert stage.num_layers == 40 and weight_bytes(stage) < weight_bytes(cfg)
    with pytest.raises(KvjaxError, match="pp=81 exceeds num_layers=80"):
        placed.stage_config(cfg, 81)


def test_an_attention_group_under_expert_parallelism_by_hand():
    """deepseek-v3 over 8 devices (DP attention 8, EP 8): a device holds 32 of the 256 experts
    (its weights within 0.1% of `placed_weight_bytes`: the router's rows aside), and its step of
    4 decodes adds 2 x 58 all-to-alls of 4 tokens x 8 picks x 7168 x 2 bytes, 7/8 of it sent."""
    cfg, chip = get_model_config("deepseek-v3"), get_chip("h200")
    dev = placed.expert_device_config(cfg, 8)
    assert dev.num_experts == 32
    assert weight_bytes(dev) == pytest.approx(
        placed_weight_bytes(cfg, Placement(tp=1, ep=8, dp_attention=8)), rel=1e-3)  # fmt: skip
    inner = ClosedFormStepTime(dev, chip)
    step = placed.ExpertParallelStepTime(inner, cfg, chip, 8)
    batch = _decodes(4)
    sent = 2 * 58 * 4 * 8 * 7168 * 2 * 7 / 8
    assert step(batch) == pytest.approx(inner(batch) + sent / 450e9, rel=1e-12)
    with pytest.raises(KvjaxError, match="ep=3 does not divide num_experts=256"):
        placed.expert_device_config(cfg, 3)


def test_simulate_runs_the_placements_and_refuses_the_others_by_flag(capsys):
    """`--tp 2 --pp 2`: 4 chips, 2 micro-batch copies; mixtral with `--dp-attention 2 --ep 2`:
    2 chips; an expert-parallel run without its attention groups, a dense model under --ep and
    --pp with --disaggregate are refused by flag."""
    flags = ["simulate", "--rate", "20", "--requests", "16", "--prompt-len", "200",
             "--output-len", "20", "--chip", "h100-sxm", "--json"]  # fmt: skip
    assert main([*flags, "--model", "llama-2-70b", "--tp", "2", "--pp", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["tp"], out["pp"], out["chips"], out["requests_out"]) == (2, 2, 4, 16)
    moe = ["--model", "mixtral-8x7b", "--weight-dtype", "fp8", "--dp-attention", "2", "--ep", "2"]
    assert main([*flags, *moe]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["ep"], out["dp_attention"], out["chips"], out["requests_out"]) == (2, 2, 2, 16)
    for bad, said in ((["--model", "mixtral-8x7b", "--ep", "2"], "--ep D --dp-attention D"),
                      (["--model", "llama-2-70b", "--ep", "2", "--dp-attention", "2"],
                       "has no experts"),
                      (["--model", "llama-3-8b", "--pp", "2", "--disaggregate"],
                       "do not go together"),
                      (["--model", "mixtral-8x7b", "--tp", "2", "--ep", "2", "--dp-attention",
                        "2"], "--tp 2 with --ep 2"),
                      (["--model", "llama-3-8b", "--pp", "2", "--step-time", "fitted", "--steps",
                        "x.json"], "--step-time fitted runs the one engine")):  # fmt: skip
        assert main([*flags, *bad]) == 2
        assert said in capsys.readouterr().err
