"""The measured view: kernels and steps timed on the machine at hand, against ceilings measured
on that same machine.

- `timing`: the harness (warm-up, median and spread, device name and free memory);
- `ceilings`: this device's roofline (matmul FLOP/s per dtype, memory bandwidth), cached;
- `kernels`: each kernel of a layer jitted alone;
- `step`: the step as it is served;
- `bench`: both placed on the measured roofline (`kvjax bench`);
- `interleave`: sweeps timed in turns, checked against their bounds and one another;
- `profile`: the served step profiled in situ;
- `attribution`: its time per kernel (or fused group) as rows;
- `engine`: the serving engine, kvjax's scheduler on the wall clock;
- `engine_steps`: the engine's jitted device programs over a slotted cache.
"""
