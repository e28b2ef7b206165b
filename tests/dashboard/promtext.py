"""A strict reader of the Prometheus text exposition format (0.0.4), for the tests.

Stricter than Prometheus itself where the format leaves room: every family
has exactly one ``# HELP`` and one ``# TYPE``, both before its samples, and
its samples are contiguous; no series appears twice; counters end in
``_total`` and never go negative; a histogram's buckets are cumulative, end
with ``le="+Inf"`` and that bucket equals ``_count``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"')
VALUE = re.compile(r"[+-]?(?:Inf|NaN|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)")
TYPES = {"counter", "gauge", "histogram", "summary", "untyped"}


class FormatError(AssertionError):
    pass


@dataclass
class Family:
    name: str
    help: str | None = None
    type: str | None = None
    samples: list[tuple[str, dict[str, str], float]] = field(default_factory=list)

    def value(self, sample: str | None = None, **labels: str) -> float:
        """The one sample named ``sample`` (default: the family) whose labels include ``labels``."""
        found = [v for n, ls, v in self.samples
                 if n == (sample or self.name) and all(ls.get(k) == w for k, w in labels.items())]
        if len(found) != 1:
            raise KeyError(f"{sample or self.name}{labels}: {len(found)} samples")
        return found[0]

    def by(self, label: str, **labels: str) -> dict[str, float]:
        return {ls[label]: v for n, ls, v in self.samples
                if n == self.name and label in ls and all(ls.get(k) == w for k, w in labels.items())}


def _unescape(text: str) -> str:
    return re.sub(r"\\([\\\"n])", lambda m: "\n" if m.group(1) == "n" else m.group(1), text)


def _value(text: str, line: int) -> float:
    if not VALUE.fullmatch(text):
        raise FormatError(f"line {line}: bad value {text!r}")
    return float(text.replace("Inf", "inf").replace("NaN", "nan"))


def _family_of(sample: str, families: dict[str, Family]) -> Family | None:
    if sample in families:
        return families[sample]
    for suffix in ("_bucket", "_sum", "_count"):
        base = sample[: -len(suffix)]
        if sample.endswith(suffix) and base in families and families[base].type in ("histogram", "summary"):
            if suffix == "_bucket" and families[base].type != "histogram":
                break
            return families[base]
    return None


def parse(text: str) -> dict[str, Family]:
    if not text.endswith("\n"):
        raise FormatError("the exposition must end with a line feed")
    families: dict[str, Family] = {}
    current: Family | None = None
    closed: set[str] = set()
    seen: set[tuple[str, tuple]] = set()
    for number, line in enumerate(text[:-1].split("\n"), 1):
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            keyword, rest = line[2:6], line[7:]
            name, _, rest = rest.partition(" ")
            if not NAME.fullmatch(name):
                raise FormatError(f"line {number}: bad metric name {name!r}")
            if name in closed:
                raise FormatError(f"line {number}: family {name} continues after another family")
            family = families.setdefault(name, Family(name))
            if current is not None and current is not family:
                closed.add(current.name)
            current = family
            if family.samples:
                raise FormatError(f"line {number}: {keyword} of {name} after its samples")
            if keyword == "HELP":
                if family.help is not None:
                    raise FormatError(f"line {number}: second HELP for {name}")
                if not re.fullmatch(r"(?:[^\\]|\\[\\n])*", rest):
                    raise FormatError(f"line {number}: bad escape in HELP")
                family.help = rest
            else:
                if family.type is not None:
                    raise FormatError(f"line {number}: second TYPE for {name}")
                if rest not in TYPES:
                    raise FormatError(f"line {number}: unknown type {rest!r}")
                family.type = rest
            continue
        if line.startswith("#"):
            continue
        if not line:
            raise FormatError(f"line {number}: empty line")
        match = NAME.match(line)
        if not match:
            raise FormatError(f"line {number}: no metric name: {line!r}")
        sample, rest = match.group(), line[match.end():]
        labels: dict[str, str] = {}
        if rest.startswith("{"):
            end = 1
            while rest[end] != "}":
                pair = LABEL.match(rest, end)
                if not pair:
                    raise FormatError(f"line {number}: bad label at {rest[end:]!r}")
                if pair.group(1) in labels:
                    raise FormatError(f"line {number}: label {pair.group(1)} twice")
                labels[pair.group(1)] = _unescape(pair.group(2))
                end = pair.end()
                if rest[end] == ",":
                    end += 1
                elif rest[end] != "}":
                    raise FormatError(f"line {number}: expected , or }} in {rest!r}")
            rest = rest[end + 1:]
        if not rest.startswith(" "):
            raise FormatError(f"line {number}: no space before the value")
        parts = rest[1:].split(" ")
        if len(parts) not in (1, 2) or (len(parts) == 2 and not parts[1].lstrip("-").isdigit()):
            raise FormatError(f"line {number}: bad value/timestamp {rest!r}")
        value = _value(parts[0], number)
        family = _family_of(sample, families)
        if family is None or family is not current:
            raise FormatError(f"line {number}: sample {sample} outside its family's HELP/TYPE block")
        if family.help is None or family.type is None:
            raise FormatError(f"line {number}: {family.name} has no HELP or no TYPE before its samples")
        key = (sample, tuple(sorted(labels.items())))
        if key in seen:
            raise FormatError(f"line {number}: series {sample}{labels} twice")
        seen.add(key)
        family.samples.append((sample, labels, value))
    for family in families.values():
        _check_family(family)
    return families


def _check_family(family: Family) -> None:
    if family.type == "counter":
        if not family.name.endswith("_total"):
            raise FormatError(f"counter {family.name} does not end in _total")
        for name, labels, value in family.samples:
            if name != family.name or not value >= 0:
                raise FormatError(f"counter sample {name}{labels} = {value}")
    elif family.type == "gauge":
        if any(name != family.name for name, _, _ in family.samples):
            raise FormatError(f"gauge {family.name} has samples of another name")
    elif family.type == "histogram":
        series: dict[tuple, dict] = {}
        for name, labels, value in family.samples:
            rest = tuple(sorted((k, v) for k, v in labels.items() if k != "le"))
            entry = series.setdefault(rest, {"buckets": []})
            if name == family.name + "_bucket":
                if "le" not in labels:
                    raise FormatError(f"{name} without le")
                entry["buckets"].append((_value(labels["le"], 0), value))
            elif name in (family.name + "_sum", family.name + "_count"):
                entry[name[len(family.name) + 1:]] = value
            else:
                raise FormatError(f"histogram {family.name} has sample {name}")
        for rest, entry in series.items():
            buckets = entry["buckets"]
            if not buckets or not math.isinf(buckets[-1][0]):
                raise FormatError(f"{family.name}{rest}: no le=\"+Inf\" bucket last")
            if [b for b, _ in buckets] != sorted(b for b, _ in buckets):
                raise FormatError(f"{family.name}{rest}: buckets out of order")
            if any(later < earlier for (_, earlier), (_, later) in zip(buckets, buckets[1:])):
                raise FormatError(f"{family.name}{rest}: buckets not cumulative")
            if "count" not in entry or "sum" not in entry or entry["count"] != buckets[-1][1]:
                raise FormatError(f"{family.name}{rest}: _count missing or not the +Inf bucket")
