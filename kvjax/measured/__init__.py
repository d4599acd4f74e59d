"""The measured view: kernels and steps timed on the machine at hand, against ceilings measured
on that same machine.

- `timing`: the harness (warm-up, median and spread, device name and free memory);
- `ceilings`: this device's roofline (matmul FLOP/s per dtype, memory bandwidth), cached;
- `kernels`: each kernel of a layer jitted alone; `step`: the decode step as served;
- `bench`: both placed on the measured roofline (`kvjax bench`).
"""
