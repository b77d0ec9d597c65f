"""Optuna samplers (TPE, CMA-ES, random) driving the same search space, define-by-run.

The space is asked through a fixed integer parametrisation so every sampler can model it: per
output axis an index into its list of legal (S1, S2, S3) tile triples (sorted so neighbours are
similar, which CMA-ES relies on), per reduce axis an index into its divisors, the unroll depth
and the pad placement. A combination the sketch rejects (too many accumulators, too big a tile)
is told as failed without being measured; measured GFLOPS are told back to the study.
"""
from __future__ import annotations

from ..errors import UserError
from ..schedule.schedule import ScheduleError
from ..space.sketch import UNROLL_CHOICES, divisors
from .policy import Policy
from .random_search import RandomSearch

SAMPLERS = ("tpe", "cmaes", "random")


class OptunaSearch(Policy):
    def __init__(self, task, seed: int = 0, sampler: str = "tpe"):
        import optuna
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        if sampler not in SAMPLERS:
            raise UserError(f"unknown Optuna sampler {sampler!r}: use one of {', '.join(SAMPLERS)}")
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
        self.random = RandomSearch(task, seed)   # when the sampler only re-proposes measured code
        self.space = task.space
        self.table = _parameter_table(task.space)   # [(parameter name, path into decisions, options)]

    # ------------------------------------------------------------ parametrisation
    def _decisions(self, trial) -> dict:
        dec = self.space.default()                   # the right shape; every value is overwritten
        for name, path, opts in self.table:
            _set(dec, path, opts[trial.suggest_int(name, 0, len(opts) - 1)])
        return dec

    def _params(self, dec: dict) -> dict:
        """The trial parameters that give `dec` (to enqueue the default or add logged points)."""
        return {name: opts.index(_get(dec, path)) for name, path, opts in self.table}

    # ------------------------------------------------------------ policy interface
    def observe(self, recs: list) -> None:
        """Tell the study what the log already holds (resume)."""
        import optuna
        for r in recs:
            dec = r.decisions
            if dec is None or r.error == "NOT_IN_LOG":
                continue
            if self.space.epilogues:
                dec = {"epilogue": "fused", **dec}          # logged before the epilogue was a decision
            if self.space.orders:
                dec = {"order": self.space.orders[0], **dec}   # logged before the loop order was one
            if self.space.parallel_orders:
                dec = {"parallel": self.space.parallel_orders[0], **dec}   # logged before it was one
            if self.space.prefetched:
                dec = {"prefetch": 0, **dec}                 # logged before the prefetch was one: none
            try:
                params = self._params(dec)
            except (ValueError, KeyError, IndexError, TypeError):   # decisions of another space
                continue
            dists = {name: optuna.distributions.IntDistribution(0, len(opts) - 1) for name, _, opts in self.table}
            self.study.add_trial(optuna.trial.create_trial(params=params, distributions=dists,
                                                           value=self._value_of_record(r)))
            if r.code_hash:
                self.values[r.code_hash] = self._value_of_record(r)

    def _value_of_record(self, r: dict) -> float:
        lat = r.latency
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
            if not self.space.valid(dec):
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


def _parameter_table(space) -> list:
    """The space as integer parameters: (name, path into the decisions, options in a stable order).

    Tile options are every legal (S1, S2, S3) triple of an axis, sorted so that neighbouring
    indices are similar tilings (CMA-ES treats the index as ordinal).
    """
    if space.kind != "tiled":
        return [(name, (name,), list(opts)) for name, opts in space.choices().items()]
    rows = [(f"pad.{p}", ("pad", p), list(space.pad_places)) for p in space.pads]
    rows += [("epilogue", ("epilogue",), list(space.epilogues))] if space.epilogues else []
    for d in range(len(space.out_shape)):
        rows.append((f"tile.{d}", ("tile", d), sorted(space.tile_options(d), key=lambda t: (t[2], t[1], t[0]))))
    rows += [(f"reduce.{r}", ("reduce", j), divisors(e)) for j, (r, e) in enumerate(space.reduce_axes)]
    rows.append(("unroll", ("unroll",), list(UNROLL_CHOICES)))
    rows += [("order", ("order",), list(space.orders))] if space.orders else []
    rows += [("parallel", ("parallel",), list(space.parallel_orders))] if space.parallel_orders else []
    rows += [("prefetch", ("prefetch",), list(space.prefetch_options))] if space.prefetched else []
    return rows


def _get(dec: dict, path: tuple):
    v = dec[path[0]]
    return list(v[path[1]]) if path[0] == "tile" else v[path[1]] if len(path) > 1 else v


def _set(dec: dict, path: tuple, value) -> None:
    if len(path) == 1:
        dec[path[0]] = value
    else:
        dec[path[0]][path[1]] = list(value) if path[0] == "tile" else value
