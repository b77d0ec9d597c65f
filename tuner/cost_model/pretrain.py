"""Pre-trained cost models: trained on many tasks' logs, shipped, and fine-tuned in a session.

A model trained on other tasks' measurements already orders a new task's candidates well
(bench/cost_model.py, "transfer"), so a search that starts from one skips its random warm-up.
`tuner/schedules/` ships the best schedules; `tuner/cost_model/pretrained/` ships one model per target
kind and ISA (cpu-avx2, cuda-sm_90), trained on this project's benchmark logs by `tuner pretrain`.
"""
from __future__ import annotations

from pathlib import Path

from ..database import records
from ..errors import UserError
from ..space.sketch import SPACE_VERSION
from .dataset import FeatureCache, from_records
from .model import XGBModel, normalised_throughput

PRETRAINED_DIR = Path(__file__).parent / "pretrained"


# Shipped models that stand in for a target ISA with none of its own, nearest first. The features
# describe the code generated for the target's own vector width, so a model learnt on another ISA
# still orders candidates, but less well than one learnt on the ISA itself: on MobileNetV2's tune
# logs from this project's AVX2 host the AVX-512 model ordered 0.62 of pairs alike (median over 51
# tasks; a random model 0.51), the AVX2 model, trained on the same host's ResNet-50 and GoogLeNet
# tunes and never on MobileNetV2, 0.74 (python -m bench.transfer LOG --model NAME measures it).
STAND_INS = {"avx2": ("avx512",), "sse": ("avx2", "avx512"), "avx512": ("avx2",)}


def shipped_model(target) -> Path | None:
    """The shipped pre-trained model for the target's kind and ISA (cpu-avx2, cuda-sm_90), else one
    that stands in: STAND_INS for a CPU, the nearest compute capability shipped for a GPU; or None."""
    for isa in (target.isa, *STAND_INS.get(target.isa, ())):
        path = PRETRAINED_DIR / f"{target.kind}-{isa}.ubj"
        if path.exists():
            return path
    if target.kind == "cuda":
        near = sorted(PRETRAINED_DIR.glob("cuda-sm_*.ubj"), key=lambda p: abs(_sm(p.stem) - _sm(target.isa)))
        return near[0] if near else None
    return None


def _sm(text: str) -> int:
    return int(text.rpartition("sm_")[2] or 0)


def pretrain(logs: list, exclude: set = frozenset(), objective: str = "pack-sum", seed: int = 0,
             progress: bool = True, cache: FeatureCache | None = None) -> tuple:
    """Train a model on every measured record of `logs` except those of workloads named or keyed in
    `exclude` (to evaluate transfer to them honestly). Returns (model, summary dict).

    cache: features already computed (several models trained from the same logs)."""
    from tqdm import tqdm
    recs, skipped = [], 0
    for path in logs:
        contents = records.load(path, warn=False)
        skipped += contents.skipped
        recs += [r for r in records.measured(contents.records)
                 if r.workload.key not in exclude and r.workload.name not in exclude]
    if not recs:
        raise UserError(f"no measured records to train on in {', '.join(map(str, logs))}"
                         + (f" once {', '.join(sorted(exclude))} are left out" if exclude else ""))
    with tqdm(total=len(recs), desc="features", unit="rec", disable=not progress, dynamic_ncols=True) as bar:
        feats, lats, groups = from_records(recs, cache or FeatureCache(), progress=bar.update)
    model = XGBModel.for_corpus(objective, seed)
    model.fit(feats, normalised_throughput(lats, groups), groups)
    names = sorted({r.workload.title for r in recs})
    summary = {"records": len(feats), "groups": len(set(groups)), "workloads": names,
               "targets": sorted({r.target for r in recs}), "space": SPACE_VERSION, "logs": [str(p) for p in logs],
               "excluded": sorted(exclude), "skipped_lines": skipped}
    return model, summary
