"""What a run did (:class:`Stats`: inputs, outcomes, findings, crashes), merged across children,
and its summary (:func:`format_stats`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from codec.fuzzing.findings import Outcome


@dataclass
class Stats:
    """What one run did: inputs, outcomes by label, findings (label -> smallest input), time."""

    target: str
    inputs: int = 0
    seconds: float = 0.0
    outcomes: dict = field(default_factory=dict)
    findings: dict = field(default_factory=dict)  # label -> {"count", "detail", "size", "file"}
    per_codec: dict = field(default_factory=dict)
    crashes: list = field(default_factory=list)  # [{"kind", "file", "iteration"}]

    def add(self, other: "Stats") -> None:
        self.inputs += other.inputs
        self.seconds += other.seconds
        for k, v in other.outcomes.items():
            self.outcomes[k] = self.outcomes.get(k, 0) + v
        for k, v in other.per_codec.items():
            self.per_codec[k] = self.per_codec.get(k, 0) + v
        for k, v in other.findings.items():
            mine = self.findings.get(k)
            if mine is None:
                self.findings[k] = dict(v)
            else:
                mine["count"] += v["count"]
                if v["size"] < mine["size"]:
                    mine.update(size=v["size"], file=v["file"], detail=v["detail"])
        self.crashes += other.crashes

    def to_json(self) -> dict:
        return {"target": self.target, "inputs": self.inputs, "seconds": round(self.seconds, 2), "outcomes": self.outcomes,
                "findings": self.findings, "per_codec": self.per_codec, "crashes": self.crashes}

    @classmethod
    def from_json(cls, d: dict) -> "Stats":
        return cls(d["target"], d["inputs"], d["seconds"], d["outcomes"], d["findings"], d.get("per_codec", {}), d.get("crashes", []))

    @property
    def n_findings(self) -> int:
        return sum(v["count"] for v in self.findings.values()) + len(self.crashes)


def _outcome_key(o: Outcome) -> str:
    if o.kind == "finding":
        return "FINDING"
    if o.kind == "ok":
        return "ok"
    return f"{o.kind}:{o.label}"


def input_name(kind: str, data: bytes) -> str:
    return f"{kind}-{hashlib.sha1(data).hexdigest()[:16]}"


def format_stats(stats: Stats) -> str:
    lines = [f"target {stats.target}: {stats.inputs} inputs in {stats.seconds:.1f} s"
             f" ({stats.inputs / stats.seconds if stats.seconds else 0:.0f}/s)"]
    for k, v in sorted(stats.outcomes.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {v:>10}  {k}")
    if stats.findings or stats.crashes:
        lines.append(f"  findings ({len(stats.findings)} classes, {stats.n_findings} inputs):")
        for k, v in sorted(stats.findings.items()):
            lines.append(f"    {v['count']:>8} x {k}  [{v['size']} B{', ' + v['file'] if v['file'] else ''}]  {v['detail'][:100]}")
        for c in stats.crashes:
            lines.append(f"    {c['kind']} (rc {c['rc']}) at input {c['iteration']}: {c['file']}")
    else:
        lines.append("  no outcome outside the promise")
    return "\n".join(lines)
