"""A small PromQL evaluator for the subset Grafana dashboards of LLM servers use, over two scrapes.

Supported: vector selectors with ``=``, ``!=``, ``=~``, ``!~`` matchers; range selectors inside
``rate`` and ``increase``; ``histogram_quantile``; ``sum``/``max``/``min``/``avg``/``count`` with
``by (...)`` or ``without (...)`` before or after the argument; binary ``+ - * /`` between vectors
(one-to-one on identical label sets) and with scalars; parentheses; number literals.

Semantics follow Prometheus (https://prometheus.io/docs/prometheus/latest/querying/), with the range
of a range selector holding exactly the two scrapes given (``before`` at ``t0``, ``after`` at
``t1``): ``increase = v1 - v0`` and ``rate = (v1 - v0) / (t1 - t0)`` without Prometheus's
extrapolation to the window edges, for series present in both scrapes; an instant selector reads
``after``. Function results drop ``__name__``. ``histogram_quantile`` is Prometheus's
``bucketQuantile``: linear interpolation inside the bucket where the rank falls, the lower bound of
the first bucket 0, the highest finite bound when the rank falls in ``+Inf``, NaN without
observations.

A vector is ``{frozenset(labels.items()): value}`` with ``__name__`` among the labels of raw series.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict

from prometheus_client.parser import text_string_to_metric_families

Vector = dict[frozenset, float]

_TOKEN = re.compile(r"""\s*(?:
    (?P<number>\d+(?:\.\d*)?(?:[eE][+-]?\d+)?)
  | (?P<duration>\[[^\]]+\])
  | (?P<string>"(?:\\.|[^"\\])*")
  | (?P<op>=~|!~|!=|[-+*/(){},=])
  | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
)""", re.VERBOSE)
_AGGREGATIONS = {"sum": sum, "max": max, "min": min, "avg": lambda v: sum(v) / len(v), "count": len}


def parse_scrape(text: str) -> Vector:
    """``/metrics`` text -> vector of every sample (``__name__`` = the sample name)."""
    vector: Vector = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            vector[frozenset({"__name__": s.name, **s.labels}.items())] = float(s.value)
    return vector


def tokenize(expr: str) -> list[tuple[str, str]]:
    tokens, pos = [], 0
    expr = expr.strip()
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if m is None or m.end() == pos:
            raise ValueError(f"cannot parse PromQL at {expr[pos:pos + 30]!r}")
        kind = m.lastgroup
        tokens.append((kind, m.group(kind)))
        pos = m.end()
        while pos < len(expr) and expr[pos].isspace():
            pos += 1
    return tokens


class Evaluator:
    """Evaluate expressions against ``before``/``after`` scrapes taken ``seconds`` apart."""

    def __init__(self, before: Vector, after: Vector, seconds: float):
        if seconds <= 0:
            raise ValueError("the scrapes must be taken in order, some time apart")
        self.before, self.after, self.seconds = before, after, seconds

    def evaluate(self, expr: str) -> Vector | float:
        self.tokens, self.pos = tokenize(expr), 0
        result = self._expr()
        if self.pos != len(self.tokens):
            raise ValueError(f"unexpected {self.tokens[self.pos][1]!r} in {expr!r}")
        return result

    # -- grammar: expr := term (('+'|'-') term)*; term := factor (('*'|'/') factor)* ---------------

    def _peek(self) -> tuple[str, str] | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def _take(self, value: str | None = None, kind: str | None = None) -> str:
        token = self._peek()
        if token is None or (value is not None and token[1] != value) or (kind is not None and token[0] != kind):
            raise ValueError(f"expected {value or kind}, got {token}")
        self.pos += 1
        return token[1]

    def _expr(self):
        left = self._term()
        while self._peek() in (("op", "+"), ("op", "-")):
            left = binary(self._take(), left, self._term())
        return left

    def _term(self):
        left = self._factor()
        while self._peek() in (("op", "*"), ("op", "/")):
            left = binary(self._take(), left, self._factor())
        return left

    def _factor(self):
        kind, value = self._peek() or ("", "")
        if kind == "number":
            self.pos += 1
            return float(value)
        if (kind, value) == ("op", "("):
            self._take("(")
            inner = self._expr()
            self._take(")")
            return inner
        if kind != "ident":
            raise ValueError(f"unexpected {value!r}")
        if value in _AGGREGATIONS:
            return self._aggregation()
        if value in ("rate", "increase"):
            return self._range_function()
        if value == "histogram_quantile":
            self._take(kind="ident")
            self._take("(")
            q = self._expr()
            self._take(",")
            vector = self._expr()
            self._take(")")
            return histogram_quantile(q, vector)
        return self._selector()

    def _aggregation(self):
        op = _AGGREGATIONS[self._take(kind="ident")]
        grouping = self._grouping()
        self._take("(")
        vector = self._expr()
        self._take(")")
        grouping = grouping or self._grouping() or ("by", ())
        return aggregate(op, vector, *grouping)

    def _grouping(self) -> tuple[str, tuple[str, ...]] | None:
        token = self._peek()
        if token is None or token[1] not in ("by", "without"):
            return None
        mode = self._take()
        self._take("(")
        labels = []
        while self._peek() != ("op", ")"):
            labels.append(self._take(kind="ident"))
            if self._peek() == ("op", ","):
                self._take(",")
        self._take(")")
        return mode, tuple(labels)

    def _range_function(self):
        name = self._take(kind="ident")
        self._take("(")
        matchers = self._matchers()
        self._take(kind="duration")
        self._take(")")
        v0, v1 = select(self.before, matchers), select(self.after, matchers)
        result = {}
        for key, after in v1.items():
            if key in v0:
                grown = after - v0[key]
                labels = frozenset((k, v) for k, v in key if k != "__name__")
                result[labels] = grown / self.seconds if name == "rate" else grown
        return result

    def _selector(self):
        return select(self.after, self._matchers())

    def _matchers(self) -> list[tuple[str, str, str]]:
        matchers = []
        if self._peek() and self._peek()[0] == "ident":
            matchers.append(("__name__", "=", self._take(kind="ident")))
        if self._peek() == ("op", "{"):
            self._take("{")
            while self._peek() != ("op", "}"):
                label = self._take(kind="ident")
                op = self._take()
                text = self._take(kind="string")
                matchers.append((label, op, bytes(text[1:-1], "utf-8").decode("unicode_escape")))
                if self._peek() == ("op", ","):
                    self._take(",")
            self._take("}")
        if not matchers:
            raise ValueError("empty selector")
        return matchers


def select(vector: Vector, matchers: list[tuple[str, str, str]]) -> Vector:
    def ok(labels: dict) -> bool:
        for label, op, value in matchers:
            have = labels.get(label, "")
            if op == "=" and have != value or op == "!=" and have == value:
                return False
            if op in ("=~", "!~") and (re.fullmatch(value, have) is None) == (op == "=~"):
                return False
        return True

    return {key: v for key, v in vector.items() if ok(dict(key))}


def aggregate(op, vector: Vector, mode: str, labels: tuple[str, ...]) -> Vector:
    groups: dict[frozenset, list[float]] = defaultdict(list)
    for key, value in vector.items():
        keep = {k: v for k, v in key if k != "__name__" and ((k in labels) == (mode == "by"))}
        groups[frozenset(keep.items())].append(value)
    return {key: float(op(values)) for key, values in groups.items()}


def binary(op: str, left, right):
    apply = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
             "/": lambda a, b: a / b if b != 0 else (math.nan if a == 0 else math.copysign(math.inf, a))}[op]
    if isinstance(left, float) and isinstance(right, float):
        return apply(left, right)
    if isinstance(right, float):
        return {_drop_name(k): apply(v, right) for k, v in left.items()}
    if isinstance(left, float):
        return {_drop_name(k): apply(left, v) for k, v in right.items()}
    rights = {_drop_name(k): v for k, v in right.items()}
    return {_drop_name(k): apply(v, rights[_drop_name(k)]) for k, v in left.items() if _drop_name(k) in rights}


def _drop_name(key: frozenset) -> frozenset:
    return frozenset((k, v) for k, v in key if k != "__name__")


def histogram_quantile(q: float, vector: Vector) -> Vector:
    series: dict[frozenset, list[tuple[float, float]]] = defaultdict(list)
    for key, value in vector.items():
        labels = dict(key)
        if "le" not in labels:
            continue
        rest = frozenset((k, v) for k, v in key if k not in ("le", "__name__"))
        series[rest].append((float(labels["le"]), value))
    return {key: bucket_quantile(q, sorted(buckets)) for key, buckets in series.items()}


def bucket_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus's ``bucketQuantile`` on sorted ``(upper bound, cumulative count)`` pairs."""
    if math.isnan(q) or not buckets or buckets[-1][0] != math.inf or len(buckets) < 2:
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    total = buckets[-1][1]
    if total == 0:
        return math.nan
    rank = q * total
    index = next(i for i, (_, count) in enumerate(buckets) if count >= rank)
    if index == len(buckets) - 1:
        return buckets[-2][0]
    if index == 0 and buckets[0][0] <= 0:
        return buckets[0][0]
    start, below = (0.0, 0.0) if index == 0 else buckets[index - 1]
    end, count = buckets[index]
    return start + (end - start) * (rank - below) / (count - below)


def label_values(vector: Vector, name_regex: str, label: str) -> set[str]:
    """Grafana's ``label_values({__name__=~"REGEX"}, LABEL)``."""
    return {dict(key)[label] for key in select(vector, [("__name__", "=~", name_regex)]) if label in dict(key)}
