"""The `model.moe:` section: a mixture-of-experts MLP in every layer, and how the router spreads the tokens."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from simulator.config.sections import FieldProblem, Section

RoutingBalance = Literal["uniform", "zipf", "dirichlet"]


class RoutingConfig(Section):
    """Which experts the router picks. `uniform`: every expert receives exactly k n / E tokens (the router a
    load-balancing loss aims for). `zipf`: expert popularity p_e proportional to 1 / (e + 1)^skew. `dirichlet`:
    popularity drawn from a symmetric Dirichlet with concentration 1 / skew (larger skew, more uneven). Each
    token then picks top_k distinct experts with these probabilities, drawn from the run's seeded generator."""

    balance: RoutingBalance = "uniform"
    skew: float = 1.0

    @field_validator("skew")
    @classmethod
    def _skew_above_zero(cls, value: float, info: ValidationInfo) -> float:
        """The one rule on the skew, above 0; its refusal points a skewed balance at `balance: uniform`, the
        routing without skew a 0 may mean, and says under `uniform` that the skew is ignored there."""
        if value <= 0:
            hint = ("balance uniform ignores the skew: leave it out" if info.data.get("balance") == "uniform"
                    else "or balance: uniform for routing without skew")
            raise ValueError(f"{value:g} is not above 0 (allowed: a value > 0, {hint})")
        return value


class MoEConfig(Section):
    """Experts per layer, experts per token (`top_k`), the capacity factor (None: no token is dropped), each
    expert's FFN width, always-active shared experts, and the routing. Over a preset with experts of its own,
    a field left out keeps the preset's value; otherwise `experts` is required and the others default to
    top_k 1, no capacity factor, the model's `ffn_hidden` and no shared expert (workload/training.py
    `resolve_model`, which also checks top_k against experts taken from the preset)."""

    experts: int | None = Field(default=None, ge=1, le=65_536)
    top_k: int | None = Field(default=None, ge=1)
    capacity_factor: float | None = Field(default=None, gt=0)
    expert_ffn_hidden: int | None = Field(default=None, ge=1)
    shared_experts: int | None = Field(default=None, ge=0)
    routing: RoutingConfig = RoutingConfig()

    @model_validator(mode="after")
    def _top_k_within_experts(self) -> MoEConfig:
        if self.top_k is not None and self.experts is not None and self.top_k > self.experts:
            raise FieldProblem(("top_k",), f"top_k {self.top_k} is above the {self.experts} experts",
                               f"1 to {self.experts}: each token picks distinct experts")
        return self
