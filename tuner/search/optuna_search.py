"""Optuna samplers (TPE, CMA-ES, random) driving the same search space, define-by-run.

The space is asked through a fixed integer parametrisation so every sampler can model it: per
output axis an index into its list of legal (S1, S2, S3) tile triples (sorted so neighbours are
similar, which CMA-ES relies on), per reduce axis an index into its divisors, the unroll depth
and the pad placement. A combination the sketch rejects (too many accumulators, too big a tile)
is told as failed without being measured; measured GFLOPS are told back to the study.
"""
from __future__ import annotations

from ..schedule.schedule import ScheduleError
from ..space.sketch import MAX_ACCUMULATORS, UNROLL_CHOICES, divisors

SAMPLERS = ("tpe", "cmaes", "random")


class OptunaSearch:
    def __init__(self, task, seed: int = 0, sampler: str = "tpe"):
        import optuna
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        if sampler not in SAMPLERS:
            raise ValueError(f"unknown Optuna sampler {sampler!r}: use one of {', '.join(SAMPLERS)}")
        self.name = f"optuna:{sampler}"
        self.task = task
        self.seed = seed
        made = {"tpe": lambda: optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=16),
                "cmaes": lambda: optuna.samplers.CmaEsSampler(seed=seed, n_startup_trials=16,
                                                              warn_independent_sampling=False),
                "random": lambda: optuna.samplers.RandomSampler(seed=seed)}[sampler]()
        self.study = optuna.create_study(direction="maximize", sampler=made)
        self.pending: dict = {}
        self.values: dict = {}          # code hash -> GFLOPS told, for re-proposed code
        from .random_search import RandomSearch
        self.random = RandomSearch(task, seed)   # when the sampler only re-proposes measured code
        space = task.space
        self.space = space
        if space.kind == "tiled":
            self.triples = []
            for d, e in enumerate(space.out_shape):
                last = d == len(space.out_shape) - 1
                s3_options = space.last_options if last else [x for x in divisors(e) if x <= MAX_ACCUMULATORS]
                opts = [[s1, s2, s3] for s3 in s3_options for s2 in divisors(e // s3) for s1 in divisors(e // (s3 * s2))]
                self.triples.append(sorted(opts, key=lambda t: (t[2], t[1], t[0])))

    # ------------------------------------------------------------ parametrisation
    def _decisions(self, trial) -> dict:
        sp = self.space
        if sp.kind == "injective":
            return {"vec": sp.last_options[trial.suggest_int("vec", 0, len(sp.last_options) - 1)],
                    "unroll": trial.suggest_int("unroll", 0, 1)}
        return {
            "pad": {p: ("inline", "root")[trial.suggest_int(f"pad.{p}", 0, 1)] for p in sp.pads},
            "tile": [list(opts[trial.suggest_int(f"tile.{d}", 0, len(opts) - 1)]) for d, opts in enumerate(self.triples)],
            "reduce": [divisors(e)[trial.suggest_int(f"reduce.{r}", 0, len(divisors(e)) - 1)] for r, e in sp.reduce_axes],
            "unroll": UNROLL_CHOICES[trial.suggest_int("unroll", 0, len(UNROLL_CHOICES) - 1)],
        }

    def _params(self, dec: dict) -> dict:
        """The trial parameters that give `dec` (to enqueue the default or add logged points)."""
        sp = self.space
        if sp.kind == "injective":
            return {"vec": sp.last_options.index(dec["vec"]), "unroll": dec["unroll"]}
        p = {f"pad.{k}": ("inline", "root").index(v) for k, v in dec["pad"].items()}
        p.update({f"tile.{d}": opts.index(list(dec["tile"][d])) for d, opts in enumerate(self.triples)})
        p.update({f"reduce.{r}": divisors(e).index(dec["reduce"][j]) for j, (r, e) in enumerate(sp.reduce_axes)})
        p["unroll"] = UNROLL_CHOICES.index(dec["unroll"])
        return p

    # ------------------------------------------------------------ policy interface
    def observe(self, recs: list) -> None:
        """Tell the study what the log already holds (resume)."""
        import optuna
        for r in recs:
            dec = r.get("decisions")
            if dec is None or r["error"] == "NOT_IN_LOG":
                continue
            try:
                params = self._params(dec)
            except (ValueError, KeyError, IndexError):
                continue
            dists = {k: optuna.distributions.IntDistribution(0, self._upper(k)) for k in params}
            self.study.add_trial(optuna.trial.create_trial(params=params, distributions=dists,
                                                           value=self._value_of_record(r)))
            if r.get("code_hash"):
                self.values[r["code_hash"]] = self._value_of_record(r)

    def _upper(self, name: str) -> int:
        sp = self.space
        if name == "vec":
            return len(sp.last_options) - 1
        if name.startswith("pad.") or name == "unroll" and sp.kind == "injective":
            return 1
        if name.startswith("tile."):
            return len(self.triples[int(name.split(".")[1])]) - 1
        if name.startswith("reduce."):
            r = name.split(".", 1)[1]
            return len(divisors(dict(sp.reduce_axes)[r])) - 1
        return len(UNROLL_CHOICES) - 1

    def _value_of_record(self, r: dict) -> float:
        from .. import records
        lat = records.latency(r)
        return self.task.workload.flops / lat / 1e9 if lat != float("inf") else 0.0

    def propose(self, n: int, seen: set, first: bool = False) -> list:
        import optuna
        out = []
        if first:
            self.study.enqueue_trial(self._params(self.space.default()))
        attempts = 0
        while len(out) < n and attempts < 50 * n + 100:
            attempts += 1
            trial = self.study.ask()
            dec = self._decisions(trial)
            if self.space.kind == "tiled" and not self.space.valid_tile(dec["tile"]):
                self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
                continue
            try:
                cand = self.task.from_decisions(dec)
            except ScheduleError:
                self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
                continue
            if cand.code_hash in seen:
                # measured before: tell the sampler what it measured (no new measurement)
                if cand.code_hash in self.values:
                    self.study.tell(trial, self.values[cand.code_hash])
                else:
                    self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
                if attempts > 4 * n + 16:       # converged: fill the batch at random instead of spinning
                    out += self.random.propose(n - len(out), seen)
                    break
                continue
            seen.add(cand.code_hash)
            self.pending[cand.code_hash] = trial
            out.append(cand)
        return out

    def update(self, cand, result) -> None:
        trial = self.pending.pop(cand.code_hash, None)
        if trial is None:
            return
        if result.error == "NOT_IN_LOG":
            import optuna
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
            return
        gflops = self.task.workload.flops / result.latency / 1e9 if result.ok else 0.0
        self.values[cand.code_hash] = gflops
        self.study.tell(trial, gflops)
