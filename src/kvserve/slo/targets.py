"""Latency targets of a request (kvserve's SLO extension) and the classes that give defaults.

A request states its targets in its body (``"slo": {"ttft_ms": 1000, "tpot_ms": 100, "on_miss":
"reject"}``) or in headers (``X-SLO-TTFT-Ms``, ``X-SLO-TPOT-Ms``, ``X-SLO-On-Miss``); the body wins
field by field. Without either, its class gives them: ``--slo-classes`` maps a class name to
targets and to what selects it, an API key or a ``priority`` value::

    {"interactive": {"ttft_ms": 1000, "tpot_ms": 100, "priority": 0},
     "batch": {"priority": 1},
     "tenant-a": {"ttft_ms": 500, "api_keys": ["key-a"]}}

An API key's class comes before a priority's. A request with no target at all is scheduled and
admitted as without the feature.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Literal, Mapping

from kvserve.errors import ConfigError, InvalidRequestError

OnMiss = Literal["reject", "queue"]
ON_MISS_VALUES = ("reject", "queue")
# Below a millisecond no step of any engine answers; above a day a target means nothing.
MIN_TARGET_MS = 1.0
MAX_TARGET_MS = 86_400_000.0
# A waiting request without TTFT target is ordered as if its prompt had to start this long after
# its arrival (``Request.queue_key``): after every request with one, in arrival order among
# themselves (they progress through their share of the rows, ``kvserve.slo.scheduling``).
UNTARGETED_AFTER_S = 1e9
HEADERS = {"ttft_ms": "X-SLO-TTFT-Ms", "tpot_ms": "X-SLO-TPOT-Ms", "on_miss": "X-SLO-On-Miss"}


@dataclass(frozen=True)
class SLOTarget:
    """What one request asks: time to first token and time per output token, in milliseconds
    (None: no target), and what to do when the engine predicts a miss at admission.

    Attributes:
        ttft_ms: the first token within this many ms of arrival, or None.
        tpot_ms: each later token within this many ms on average, or None.
        on_miss: ``reject`` (429 now, with the prediction) or ``queue`` (accept it anyway).
        slo_class: the ``--slo-classes`` name the targets came from, or None (the request's own).
    """

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    on_miss: OnMiss = "reject"
    slo_class: str | None = None

    @property
    def has_targets(self) -> bool:
        return self.ttft_ms is not None or self.tpot_ms is not None

    def met(self, ttft_s: float, tpot_s: float) -> bool:
        """Whether a finished choice's TTFT and TPOT (seconds; TPOT 0 with fewer than 2 tokens)
        kept the targets."""
        return (self.ttft_ms is None or ttft_s * 1000 <= self.ttft_ms) and \
            (self.tpot_ms is None or tpot_s * 1000 <= self.tpot_ms)

    @classmethod
    def parse(cls, fields: Mapping[str, Any], param: str, slo_class: str | None = None) -> SLOTarget:
        """Targets from a JSON object (a body's ``slo``, a class of ``--slo-classes``, headers).

        Args:
            fields: ``ttft_ms``, ``tpot_ms``, ``on_miss`` (each optional); any other key is refused.
            param: the name to blame (``slo``), prefixed to each field's.

        Raises:
            InvalidRequestError: an unknown key, a target that is not a number in
                [MIN_TARGET_MS, MAX_TARGET_MS], or an ``on_miss`` other than ``reject``/``queue``.
        """
        unknown = sorted(set(fields) - set(HEADERS))
        if unknown:
            raise InvalidRequestError(f"{param} has unknown field(s) {unknown}; allowed: {sorted(HEADERS)}",
                                      param=f"{param}.{unknown[0]}")
        return cls._checked(fields, {name: f"{param}.{name}" for name in HEADERS}, slo_class)

    @classmethod
    def from_headers(cls, fields: Mapping[str, str]) -> SLOTarget:
        """Targets from the ``X-SLO-*`` headers' text (``fields`` by target name), each blamed by
        its header's name.

        Raises:
            InvalidRequestError: as :meth:`parse`.
        """
        if "on_miss" in fields:
            fields = {**fields, "on_miss": fields["on_miss"].strip().lower()}
        return cls._checked(fields, HEADERS)

    @classmethod
    def _checked(cls, fields: Mapping[str, Any], names: Mapping[str, str], slo_class: str | None = None) -> SLOTarget:
        """The targets of ``fields``, each bad value blamed by its name in ``names``."""
        on_miss = fields.get("on_miss", "reject")
        if on_miss not in ON_MISS_VALUES:
            raise InvalidRequestError(f"{names['on_miss']} must be one of {list(ON_MISS_VALUES)}, got {on_miss!r}",
                                      param=names["on_miss"])
        return cls(ttft_ms=_target(fields.get("ttft_ms"), names["ttft_ms"]),
                   tpot_ms=_target(fields.get("tpot_ms"), names["tpot_ms"]), on_miss=on_miss, slo_class=slo_class)


def _target(value: Any, param: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, str):  # a header's text
        try:
            value = float(value)
        except ValueError:
            raise InvalidRequestError(f"{param} must be a number of milliseconds, got {value!r}", param=param) from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidRequestError(f"{param} must be a number of milliseconds, got {value!r}", param=param)
    if not MIN_TARGET_MS <= value <= MAX_TARGET_MS:
        raise InvalidRequestError(f"{param} must be between {MIN_TARGET_MS:g} and {MAX_TARGET_MS:g} ms, got {value:g}",
                                  param=param)
    return float(value)


@dataclass(frozen=True)
class SLOClass:
    """One ``--slo-classes`` entry: its targets and what selects it."""

    target: SLOTarget
    priority: int | None = None
    api_keys: frozenset[str] = frozenset()


class SLOClasses:
    """The classes of ``--slo-classes`` and the choice of a request's targets.

    Args:
        classes: name -> class.

    Raises:
        ConfigError: two classes claim the same priority or API key.
    """

    def __init__(self, classes: Mapping[str, SLOClass]):
        self.classes = dict(classes)
        self._by_priority: dict[int, str] = {}
        self._by_key: dict[str, str] = {}
        for name, entry in self.classes.items():
            if entry.priority is not None:
                _claim(self._by_priority, entry.priority, name, "priority")
            for key in entry.api_keys:
                _claim(self._by_key, key, name, "API key")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SLOClasses) and self.classes == other.classes

    def __hash__(self) -> int:
        return hash(tuple(sorted(self.classes.items())))

    @classmethod
    def from_json(cls, text: str | None) -> SLOClasses:
        """``--slo-classes`` (a JSON object, or None for no classes).

        Raises:
            ConfigError: not JSON, not an object of objects, or a bad target (the message names it).
        """
        if not text:
            return cls({})
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"--slo-classes is not JSON: {exc}") from None
        if not isinstance(raw, dict) or not all(isinstance(v, dict) for v in raw.values()):
            raise ConfigError('--slo-classes must be an object of classes, e.g. {"interactive": {"ttft_ms": 1000, '
                              '"tpot_ms": 100, "priority": 0}}')
        classes = {}
        for name, entry in raw.items():
            entry = dict(entry)
            priority, keys = entry.pop("priority", None), entry.pop("api_keys", [])
            if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)):
                raise ConfigError(f"--slo-classes: {name}.priority must be an integer, got {priority!r}")
            if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
                raise ConfigError(f"--slo-classes: {name}.api_keys must be a list of strings")
            try:
                target = SLOTarget.parse(entry, name, slo_class=name)
            except InvalidRequestError as exc:
                raise ConfigError(f"--slo-classes: {exc.message}") from None
            classes[name] = SLOClass(target, priority, frozenset(keys))
        return cls(classes)

    def resolve(self, own: Mapping[str, Any], headers: Mapping[str, str], priority: int,
                api_key: str | None) -> SLOTarget | None:
        """The request's targets: its own (body ``slo`` over headers, field by field) on top of its
        class's (API key first, then priority); None when nothing gives any target.

        Raises:
            InvalidRequestError: a bad ``slo`` field or header (named).
        """
        name = self._by_key.get(api_key) if api_key is not None else None
        name = name or self._by_priority.get(priority)
        base = self.classes[name].target if name is not None else SLOTarget()
        from_headers = {field: headers[header.lower()] for field, header in HEADERS.items() if header.lower() in headers}
        if from_headers:
            base = _merged(base, SLOTarget.from_headers(from_headers), from_headers)
        if own:
            base = _merged(base, SLOTarget.parse(own, "slo"), own)
        return base if base.has_targets else None


def _merged(base: SLOTarget, top: SLOTarget, given: Mapping[str, Any]) -> SLOTarget:
    """``top``'s fields where ``given`` names them, else ``base``'s."""
    return SLOTarget(ttft_ms=top.ttft_ms if "ttft_ms" in given else base.ttft_ms,
                     tpot_ms=top.tpot_ms if "tpot_ms" in given else base.tpot_ms,
                     on_miss=top.on_miss if "on_miss" in given else base.on_miss, slo_class=base.slo_class)


def _claim(owners: dict, key: Any, name: str, what: str) -> None:
    if key in owners:
        raise ConfigError(f"--slo-classes: classes {owners[key]!r} and {name!r} both claim {what} {key!r}")
    owners[key] = name
