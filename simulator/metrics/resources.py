"""What a step and a job take in GPU time, GPU energy and money: summary.json's and job_summary.json's
`resources`, for a user weighing GPUs, layouts or checkpoint intervals by what they cost rather than by their
step time alone.

GPU time counts every GPU the run holds for the whole time it runs: a GPU idle in a pipeline bubble or waiting for a
restart is paid for. The energy is the GPUs' alone, at the power `costs.gpu_power` gives (by default the catalog
GPU's board power, which bounds it from above: a training GPU draws less on average); hosts, network and cooling are
not counted. Money needs a price per GPU-hour (`costs.gpu_hour_price`), in the scenario's currency."""

from __future__ import annotations

from dataclasses import dataclass

from simulator.catalog.gpus import get_gpu
from simulator.config.costs import CostsConfig

SECONDS_PER_HOUR = 3600.0
JOULES_PER_KWH = 3.6e6
MILLION = 1e6


@dataclass(frozen=True)
class Tariff:
    """A GPU's power while it trains (W), where it comes from, and the price of a GPU-hour (None: not given)."""

    power_w: float
    power_source: str
    gpu_hour_price: float | None
    currency: str

    @classmethod
    def of(cls, costs: CostsConfig, gpu_model: str) -> Tariff:
        """The scenario's `costs` for GPUs of catalog model ``gpu_model``."""
        if costs.gpu_power is not None:
            return cls(costs.gpu_power, "costs.gpu_power", costs.gpu_hour_price, costs.currency)
        return cls(get_gpu(gpu_model).board_power_w, "board power", costs.gpu_hour_price, costs.currency)

    def figures(self, gpu_seconds: float, tokens: float | None, *, energy: bool = True, per: str = "") -> dict:
        """GPU-hours, the GPUs' energy (kWh, where ``energy``) and the cost (where priced) of ``gpu_seconds``, each
        key ending in ``per`` ('_per_step'), then the same per million of ``tokens`` (None or 0: null)."""
        gpu_hours = gpu_seconds / SECONDS_PER_HOUR
        totals = {"gpu_hours": gpu_hours}
        if energy:
            totals["gpu_energy_kwh"] = gpu_seconds * self.power_w / JOULES_PER_KWH
        if self.gpu_hour_price is not None:
            totals["cost"] = gpu_hours * self.gpu_hour_price
        return {**{f"{key}{per}": value for key, value in totals.items()},
                **{f"{key}_per_million_tokens": value * MILLION / tokens if tokens else None
                   for key, value in totals.items()}}

    def header(self, energy: bool = True) -> dict:
        """The inputs the figures were worked out with, as the summary records them."""
        entry: dict = {}
        if energy:
            entry.update(gpu_power_w=self.power_w, gpu_power_source=self.power_source)
        if self.gpu_hour_price is not None:
            entry.update(gpu_hour_price=self.gpu_hour_price, currency=self.currency)
        return entry


def step_resources(tariff: Tariff, gpus: int, step_time_s: float, tokens_per_step: float | None) -> dict:
    """One step on ``gpus`` GPUs: its GPU-hours, the GPUs' energy and its cost, per step and per million tokens."""
    return {**tariff.header(), **tariff.figures(gpus * step_time_s, tokens_per_step, per="_per_step")}


def job_resources(tariff: Tariff, gpus: int, spare_gpus: int, horizon_s: float, ettr: float,
                  tokens_trained: float | None) -> dict:
    """A job training on ``gpus`` GPUs, holding ``spare_gpus`` more on its spare hosts, for ``horizon_s``: its
    GPU-hours, those that kept no progress (`gpu_hours_lost`: all held but the training GPUs' productive time,
    ``gpus`` x horizon x ETTR, so restarts, work redone, checkpoint stalls, slow steps and the spares standing by),
    and its cost, in all and per million tokens trained (``tokens_trained``: the goodput's over the horizon). No
    energy: a GPU that waits for a restart or stands by as a spare draws far less than while it trains, which no
    figure here knows."""
    figures = tariff.figures((gpus + spare_gpus) * horizon_s, tokens_trained, energy=False)
    productive = gpus * horizon_s * ettr / SECONDS_PER_HOUR
    return {**tariff.header(energy=False), "gpus_held": gpus + spare_gpus, "spare_gpus": spare_gpus, **figures,
            "gpu_hours_lost": figures["gpu_hours"] - productive}
