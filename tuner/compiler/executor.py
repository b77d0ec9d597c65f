"""The C entry points of a compiled model: one function per step and the executor that runs
them in order over the arena, with timing and per-step profiling (the kernels' timing rule)."""
from __future__ import annotations

import json

from ..codegen.c import PRELUDE
from ..measure.builder import TIMING

EXECUTOR = r"""
typedef struct { float** inputs; float** outputs; char* arena; char* weights; float* apart; } tuner_ctx;
%(steps)s
typedef int (*tuner_step_fn)(const tuner_ctx*);
static const tuner_step_fn tuner_steps[] = { %(table)s };
int tuner_model_steps(void) { return %(count)d; }
/* what this library was compiled for, as JSON (runtime.model checks model.json against it) */
static const unsigned char tuner_declared[] = { %(declared)s, 0 };
const char* tuner_model_declared(void) { return (const char*)tuner_declared; }
int tuner_model_run(float** inputs, float** outputs, char* arena, char* weights) {
  tuner_ctx c = { inputs, outputs, arena, weights, 0 };
  for (int i = 0; i < %(count)d; ++i) { int rc = tuner_steps[i](&c); if (rc) return 1000 + i; }
  return 0;
}
/* a step that writes over its input, run with its output in c->apart: timed alone, every call
   reads what the steps before it gave it, not its own output */
static const tuner_step_fn tuner_apart[] = { %(apart)s };
static const long long tuner_apart_bytes[] = { %(apart_bytes)s };
/* the steps before `upto`, as a run runs them: the data step `upto` is timed on */
int tuner_model_prefix(int upto, float** inputs, float** outputs, char* arena, char* weights) {
  tuner_ctx c = { inputs, outputs, arena, weights, 0 };
  for (int i = 0; i < upto && i < %(count)d; ++i) { int rc = tuner_steps[i](&c); if (rc) return 1000 + i; }
  return 0;
}
static int tuner_call(int step, const tuner_ctx* c) {
  if (step >= %(count)d) return -1;
  if (step >= 0) return c->apart ? tuner_apart[step](c) : tuner_steps[step](c);
  for (int i = 0; i < %(count)d; ++i) { int rc = tuner_steps[i](c); if (rc) return rc; }
  return 0;
}
static int tuner_time_loop(int step, const tuner_ctx* c, int repeat, double min_repeat_ms, double* costs) {
  int number = 0, flush = 0;
  TUNER_TIME_LOOP(tuner_call(step, c));
}
/* seconds per call of one step (step >= 0) or of the whole model (step < 0), by the kernels'
   timing rule (measure.builder.TIMING) */
int tuner_model_time(int step, float** inputs, float** outputs, char* arena, char* weights, int repeat,
                     double min_repeat_ms, double* costs) {
  tuner_ctx c = { inputs, outputs, arena, weights, 0 };
  if (step >= 0 && step < %(count)d && tuner_apart[step]) {
    c.apart = (float*)aligned_alloc(64, (size_t)tuner_apart_bytes[step]);
    if (!c.apart) return -1;
    int rc = tuner_time_loop(step, &c, repeat, min_repeat_ms, costs);
    free(c.apart);
    return rc;
  }
  return tuner_time_loop(step, &c, repeat, min_repeat_ms, costs);
}
/* each step's seconds in context: the whole model run `runs` times after one warm-up run, every
   step timed where it runs (its inputs as its producers left them); per_step[r * (steps + 1) + i],
   and the whole run r (steps and the dispatch between them) at per_step[r * (steps + 1) + steps] */
int tuner_model_profile(float** inputs, float** outputs, char* arena, char* weights, int runs, double* per_step) {
  tuner_ctx c = { inputs, outputs, arena, weights, 0 };
  int rc = tuner_call(-1, &c);
  for (int r = 0; r < runs && !rc; ++r) {
    double* row = per_step + r * (%(count)d + 1);
    double start = tuner_now();
    for (int i = 0; i < %(count)d && !rc; ++i) {
      double s = tuner_now();
      rc = tuner_steps[i](&c);
      row[i] = tuner_now() - s;
    }
    row[%(count)d] = tuner_now() - start;
  }
  return rc;
}
"""

_ARG_C = {"input": "c->inputs[%d]", "output": "c->outputs[%d]", "arena": "(float*)(c->arena + %d)",
          "weight": "(float*)(c->weights + %d)"}


def executor_source(kernels: list, steps: list, declared: dict, apart: dict | None = None) -> str:
    """The library's C in one file: kernels, the timing harness, one function per step and the
    executor, which also declares `declared` (as bytes: names from a model file never become C
    text). apart: {step index: its output's bytes} of the steps that write over an input."""
    return PRELUDE + "\n".join(k.source for k in kernels) + TIMING + _executor(steps, declared, apart)


def kernel_part(source: str, openmp: bool) -> tuple:
    """(C file, extra compiler flags) of one kernel compiled alone, as a model's library builds it."""
    return PRELUDE + source, ["-fopenmp"] if openmp else []


def executor_parts(kernels: list, steps: list, declared: dict, apart: dict | None = None) -> list:
    """What executor_source holds, as C files compiled apart ([(source, extra compiler flags)]):
    each kernel alone (with -fopenmp where it uses OpenMP), then the executor with the kernels'
    prototypes."""
    prototypes = "".join(f"int {k.func}(float** restrict args);\n" for k in kernels)
    return [kernel_part(k.source, k.openmp) for k in kernels] + \
        [(PRELUDE + prototypes + TIMING + _executor(steps, declared, apart), [])]


def _executor(steps: list, declared: dict, apart: dict | None) -> str:
    parts = []
    symbols = len(declared["inputs"])          # a dynamic model's symbol values follow its inputs
    for s in steps:
        args = [_ARG_C[a.kind] % a.where for a in s.args] + ([f"c->inputs[{symbols}]"] if s.dynamic else [])
        parts.append(f"/* step {s.index}: {s.summary} */\n"
                     f"static int step{s.index}(const tuner_ctx* c) {{ float* a[] = {{ {', '.join(args)} }}; "
                     f"return {s.func}(a); }}")
        if s.inplace is not None:
            args[len(s.args) - 1] = "c->apart"
            parts.append(f"static int step{s.index}_apart(const tuner_ctx* c) {{ float* a[] = {{ {', '.join(args)} }}; "
                         f"return {s.func}(a); }}")
    apart = [(f"step{s.index}_apart", -(-(apart or {})[s.index] // 64) * 64) if s.inplace is not None else ("0", 0)
             for s in steps]
    return EXECUTOR % {"steps": "\n".join(parts), "table": ", ".join(f"step{s.index}" for s in steps),
                       "apart": ", ".join(f for f, _ in apart) or "0",
                       "apart_bytes": ", ".join(str(n) for _, n in apart) or "0",
                       "count": len(steps),
                       "declared": ", ".join(str(b) for b in json.dumps(declared, sort_keys=True).encode())}
