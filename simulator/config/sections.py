"""The base of every scenario section: frozen, unknown keys rejected."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """Base of every section: frozen, unknown keys rejected."""

    model_config = ConfigDict(extra="forbid", frozen=True)
