"""Length distributions of a workload spec: how many tokens a prompt or an output has.

Each is a pydantic model tagged by ``dist`` and draws integer lengths from a seeded
``numpy.random.Generator``; every draw is rounded to the nearest integer and clipped to
``[min, max]`` (``min`` defaults to 1)::

    {dist: fixed, value: 128}
    {dist: uniform, low: 64, high: 256}            # integers, both ends included
    {dist: normal, mean: 512, std: 128}            # clipped at min/max
    {dist: lognormal, median: 400, sigma: 0.8}     # median * exp(sigma * Z), Z ~ N(0, 1)
    {dist: file, path: lengths.txt}                # sampled with replacement from the file's numbers

A ``file`` holds integers separated by whitespace or commas, or a JSON list of integers; a relative
path is read from the spec file's folder. Lognormal is parametrised by its median (``exp(mu)``),
which is what one reads off a length histogram, and ``sigma``, the standard deviation of the
natural log of the length.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Literal, Union

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationInfo, model_validator


class _Length(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    min: PositiveInt = 1
    max: PositiveInt | None = None

    @model_validator(mode="after")
    def _bounds(self):
        if self.max is not None and self.max < self.min:
            raise ValueError(f"max ({self.max}) must be >= min ({self.min})")
        return self

    def _draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        raise NotImplementedError

    def sample(self, rng: np.random.Generator, n: int) -> list[int]:
        """``n`` lengths (tokens), rounded half to even (``numpy.rint``) and clipped to ``[min, max]``."""
        values = np.rint(np.asarray(self._draw(rng, n), dtype=np.float64))
        values = np.clip(values, self.min, self.max if self.max is not None else np.inf)
        return [int(v) for v in values]

    def upper_bound(self) -> float:
        """The largest length this distribution can give (``inf`` when unbounded)."""
        return float(self.max) if self.max is not None else float("inf")


class Fixed(_Length):
    dist: Literal["fixed"]
    value: PositiveInt

    def _draw(self, rng, n):
        return np.full(n, self.value)

    def upper_bound(self) -> float:
        return float(min(self.value, self.max or self.value))


class Uniform(_Length):
    dist: Literal["uniform"]
    low: PositiveInt
    high: PositiveInt

    @model_validator(mode="after")
    def _order(self):
        if self.high < self.low:
            raise ValueError(f"high ({self.high}) must be >= low ({self.low})")
        return self

    def _draw(self, rng, n):
        return rng.integers(self.low, self.high + 1, size=n)

    def upper_bound(self) -> float:
        return float(min(self.high, self.max or self.high))


class Normal(_Length):
    dist: Literal["normal"]
    mean: float = Field(gt=0)
    std: float = Field(ge=0)

    def _draw(self, rng, n):
        return rng.normal(self.mean, self.std, size=n)


class LogNormal(_Length):
    dist: Literal["lognormal"]
    median: float = Field(gt=0)
    sigma: float = Field(ge=0)

    def _draw(self, rng, n):
        return self.median * np.exp(self.sigma * rng.standard_normal(size=n))


class FromFile(_Length):
    """Lengths sampled with replacement from a file's numbers. The file is read when the model is
    validated; a relative ``path`` is taken from the validation context's ``base_dir`` (the spec
    file's folder), else the current folder."""

    dist: Literal["file"]
    path: str
    values: tuple[int, ...] = ()

    @model_validator(mode="after")
    def _read(self, info: ValidationInfo):
        if not self.values:
            base = Path((info.context or {}).get("base_dir", "."))
            path = Path(self.path) if Path(self.path).is_absolute() else base / self.path
            object.__setattr__(self, "values", read_lengths(path))
        return self

    def _draw(self, rng, n):
        if not self.values:
            raise ValueError(f"length file {self.path} was not read (load the spec with load_spec)")
        return np.asarray(self.values)[rng.integers(0, len(self.values), size=n)]

    def upper_bound(self) -> float:
        top = float(max(self.values)) if self.values else float("inf")
        return min(top, float(self.max)) if self.max is not None else top


LengthDistribution = Annotated[Union[Fixed, Uniform, Normal, LogNormal, FromFile], Field(discriminator="dist")]


def read_lengths(path: Path) -> tuple[int, ...]:
    """The integers of a lengths file: a JSON list, or numbers separated by whitespace/commas.

    Raises:
        ValueError: unreadable, empty, or holding something that is not a positive integer.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"cannot read length file {path}: {exc.strerror or exc}") from None
    stripped = text.strip()
    items = json.loads(stripped) if stripped.startswith("[") else [t for t in re.split(r"[\s,]+", stripped) if t]
    try:
        values = tuple(int(v) for v in items)
    except (TypeError, ValueError):
        raise ValueError(f"length file {path} must hold integers only") from None
    if not values:
        raise ValueError(f"length file {path} holds no lengths")
    if min(values) < 1:
        raise ValueError(f"length file {path}: lengths must be >= 1, found {min(values)}")
    return values
