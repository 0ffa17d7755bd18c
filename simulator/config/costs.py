"""The `costs` section: what a GPU-hour costs and what a GPU draws, for the GPU time, energy and money a step and a
job take (metrics/resources.py). Nothing in it changes what is simulated."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BeforeValidator, Field

from simulator.config.sections import Section, user_value
from simulator.units import four_digits, parse_power

MIN_GPU_POWER_W = 1.0
MAX_GPU_POWER_W = 5_000.0
"""The range of board power a GPU may be given: the largest several times any part's (a GB200's 1,200 W), so a value
past it is a unit slip (700 kW), as is one under a watt (0.7 W for 0.7 kW); refused at its line."""


def _a_gpu_power(watts: float) -> float:
    """``watts`` if a GPU could draw it."""
    if not MIN_GPU_POWER_W <= watts <= MAX_GPU_POWER_W:
        raise ValueError(f"{four_digits(watts)} W is no GPU's power (allowed: {MIN_GPU_POWER_W:,.0f} W to "
                         f"{MAX_GPU_POWER_W:,.0f} W, e.g. '700 W')")
    return watts


def _a_currency(label: str) -> str:
    """``label`` if it prints as one word beside a figure."""
    if not 1 <= len(label) <= 8 or any(character.isspace() for character in label):
        raise ValueError(f"currency {label!r} is not a short label (allowed: 1 to 8 characters without spaces, e.g. "
                         "USD, EUR, $)")
    return label


Power = Annotated[float, BeforeValidator(user_value(parse_power)), AfterValidator(_a_gpu_power)]


class CostsConfig(Section):
    """`gpu_hour_price`: the price of one GPU for one hour, in `currency` (none: no money figures);
    `currency`: the label printed beside them (a code or symbol, not converted); `gpu_power`: the power each GPU
    draws while it trains (none: the catalog GPU's board power, an upper bound; `trainsim gpus` lists it)."""

    gpu_hour_price: float | None = Field(default=None, gt=0)
    currency: Annotated[str, AfterValidator(_a_currency)] = "USD"
    gpu_power: Power | None = None


NO_COSTS = CostsConfig()
"""A scenario without a `costs` section: the catalog's board power, no price."""
