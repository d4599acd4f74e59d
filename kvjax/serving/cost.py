"""Energy per token and cost per million tokens of a serving run (simulated or measured), from
the chips' power and a price per chip-hour. Pure Python.

The chips are charged for the whole run, from the first arrival to the last token, at their
rated power (`kvjax.hardware.ChipSpec.power_watts`, the datasheet's maximum thermal design
power): an upper bound on the energy, since a chip waiting between steps or bound on memory draws
less; a price per chip-hour is the user's (a cloud's list price, an amortized purchase). Both are
per output token: the tokens the run generated, prompts not counted.
"""

from __future__ import annotations

from kvjax.errors import KvjaxError


def energy_and_cost(
    output_tokens: int,
    duration_s: float,
    chips: int = 1,
    power_watts: float | None = None,
    price_per_chip_hour: float | None = None,
) -> dict[str, float | None]:
    """Joules per output token (None without a power) and the price of a million output tokens
    (None without a price)."""
    for name, value in (("power_watts", power_watts), ("price_per_chip_hour", price_per_chip_hour)):
        if value is not None and not value > 0:
            raise KvjaxError(f"{name}={value!r} must be a number > 0")
    if output_tokens < 1 or not duration_s > 0:
        raise KvjaxError(
            f"a run of {output_tokens} output tokens over {duration_s!r} s has no cost per token"
        )
    held_s = chips * duration_s  # chip-seconds
    return {
        "chips": chips,
        "power_watts": power_watts,
        "energy_j_per_output_token": None
        if power_watts is None
        else power_watts * held_s / output_tokens,
        "price_per_chip_hour": price_per_chip_hour,
        "cost_per_million_output_tokens": None
        if price_per_chip_hour is None
        else price_per_chip_hour * held_s / 3600 / output_tokens * 1e6,
    }
