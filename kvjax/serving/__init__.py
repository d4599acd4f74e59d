"""Serving under load: one scheduler and the clocks behind it, the published serving systems under
their bound and predicted. Pure Python and numpy: no jax (the engine, the wall clock, is
`kvjax.measured.engine`). Its modules:

    scheduler, pages     the vLLM-v1-style scheduler and its paged pool with prefix caching
    load                 arrivals and lengths (Poisson, gamma, a trace, a dataset's lengths)
    memory               the KV pool an engine sizes from the chip's memory
    step_time            step-time models: the closed form's bound, predicted, from kernels
    simulate, router     the simulator's clock, and copies behind a router
    placed, disagg       placements (tensor, pipeline, expert parallel) and disaggregation
    deployment           one deployment (model, chip, placement, engine) that serves requests
    fitted, steps_file   a step model fitted to an engine's measured steps, and their file
    calibrate, cost      the fitted model's calibration; energy and cost a token
    system_bound         what no deployment beats (throughput, TTFT, TPOT)
    systems              the published serving systems, each under its bound
    engines              the engine settings a published row ran with, by implementation
    system_predict       the simulator's prediction of a published row, held out
    slo_search           MLPerf's Server and Interactive scenarios searched for their rate
    system_summary       the predictions' intervals and summary by implementation and chip
"""
