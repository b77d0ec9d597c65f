"""What a compiled model's artifact holds besides its library: the steps (one kernel call each,
with where its arguments live and where its schedule came from) and what the library declares of
its model.json. Written by the compiler, read by the runtime."""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field

# where a step's schedule came from (besides a log path); OTHER_THREADS: a record's decisions for
# another thread count of the ISA, parallelised for this one; PLAIN: the decisions of a record of the
# same workload with its operands given as copies (Workload.plain), rendered to read them in place
SHIPPED, PREDICTED, OTHER_THREADS, DEFAULT, GENERIC = "shipped", "predicted", "other threads", "default", "generic"
PLAIN = "plain record"
IN_MODEL = "default, faster in the model"    # the plan's tune timed the task's record slower than this in the model
UNTUNED = (PREDICTED, OTHER_THREADS, PLAIN, DEFAULT)   # no record for this target: nothing measured promises a time

FLOAT_EXACT = 1 << 24      # integers below this magnitude are exact in float32, as integer inputs travel


@dataclass
class Arg:
    """Where a kernel argument lives: a graph input or output (by position), or a byte offset
    in the arena or in the weights."""
    kind: str            # input | output | arena | weight
    where: int


@dataclass
class Step:
    index: int
    summary: str         # "conv2d + add + relu"
    node: str            # the anchor's (or first node's) name, for people
    func: str            # C function of its kernel (shared between steps with equal code)
    args: list           # Args: inputs, then the output
    workload: str        # the task's label, or the group's output type for generic groups
    workload_key: str | None   # None for generic groups
    source: str          # log path | shipped | default | generic
    expected_s: float | None   # the latency the record promises
    flops: float
    code_hash: str
    steps: list = field(default_factory=list)
    dynamic: bool = False     # its kernel reads the run's values of the model's symbols (issue 37)
    versions: list = field(default_factory=list)   # [{"bucket", "upto", "source"}]: records at buckets, dispatched on the run's value
    inplace: int | None = None  # the argument whose memory its output takes (memory.plan), if any

    @property
    def anchor(self) -> bool:
        """A task with a workload key: an anchor group (counted by --strict and the untuned warning), or a
        layout transform that took a logged record."""
        return self.workload_key is not None

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["args"] = [[a.kind, a.where] for a in self.args]
        return d

    @staticmethod
    def from_json(d: dict) -> "Step":
        d = dict(d)
        d["args"] = [Arg(k, w) for k, w in d["args"]]
        return Step(**d)


# what the library declares of its model.json (runtime.model.load checks the file against it): the
# facts running it depends on, and a hash of every field but those known only after it is built
DECLARED = ("target", "arena_bytes", "weights_bytes", "weights_sha256", "inputs", "outputs")
UNDECLARED = ("library", "compile_s")


def declaration(meta: dict) -> dict:
    fields = json.loads(json.dumps({k: v for k, v in meta.items() if k not in UNDECLARED}))   # as read back
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return {**{k: fields.get(k) for k in DECLARED}, "meta_sha256": hashlib.sha256(text.encode()).hexdigest()}
