"""The C entry points of a compiled model: one function per step and the executor that runs
them in order over the arena, with timing and per-step profiling (the kernels' timing rule)."""
from __future__ import annotations

import json

from ..codegen.c import PRELUDE
from ..measure.builder import TIMING

EXECUTOR = r"""
typedef struct { float** inputs; float** outputs; char* arena; char* weights; } tuner_ctx;
%(steps)s
typedef int (*tuner_step_fn)(const tuner_ctx*);
static const tuner_step_fn tuner_steps[] = { %(table)s };
int tuner_model_steps(void) { return %(count)d; }
/* what this library was compiled for, as JSON (runtime.model checks model.json against it) */
static const unsigned char tuner_declared[] = { %(declared)s, 0 };
const char* tuner_model_declared(void) { return (const char*)tuner_declared; }
int tuner_model_run(float** inputs, float** outputs, char* arena, char* weights) {
  tuner_ctx c = { inputs, outputs, arena, weights };
  for (int i = 0; i < %(count)d; ++i) { int rc = tuner_steps[i](&c); if (rc) return 1000 + i; }
  return 0;
}
static int tuner_call(int step, const tuner_ctx* c) {
  if (step >= %(count)d) return -1;
  if (step >= 0) return tuner_steps[step](c);
  for (int i = 0; i < %(count)d; ++i) { int rc = tuner_steps[i](c); if (rc) return rc; }
  return 0;
}
/* seconds per call of one step (step >= 0) or of the whole model (step < 0), by the kernels'
   timing rule (measure.builder.TIMING) */
int tuner_model_time(int step, float** inputs, float** outputs, char* arena, char* weights, int repeat,
                     double min_repeat_ms, double* costs) {
  tuner_ctx c = { inputs, outputs, arena, weights };
  int number = 0, flush = 0;
  TUNER_TIME_LOOP(tuner_call(step, &c));
}
/* each step's seconds in context: the whole model run `runs` times after one warm-up run, every
   step timed where it runs (its inputs as its producers left them); per_step[r * (steps + 1) + i],
   and the whole run r (steps and the dispatch between them) at per_step[r * (steps + 1) + steps] */
int tuner_model_profile(float** inputs, float** outputs, char* arena, char* weights, int runs, double* per_step) {
  tuner_ctx c = { inputs, outputs, arena, weights };
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


def executor_source(kernels: list, steps: list, declared: dict) -> str:
    """The library's C: kernels, the timing harness, one function per step and the executor, which
    also declares `declared` (as bytes: names from a model file never become C text)."""
    parts = []
    symbols = len(declared["inputs"])          # a dynamic model's symbol values follow its inputs
    for s in steps:
        args = ", ".join([_ARG_C[a.kind] % a.where for a in s.args] + ([f"c->inputs[{symbols}]"] if s.dynamic else []))
        parts.append(f"/* step {s.index}: {s.summary} */\n"
                     f"static int step{s.index}(const tuner_ctx* c) {{ float* a[] = {{ {args} }}; "
                     f"return {s.func}(a); }}")
    return (PRELUDE + "\n".join(k.source for k in kernels) + TIMING
            + EXECUTOR % {"steps": "\n".join(parts), "table": ", ".join(f"step{s.index}" for s in steps),
                          "count": len(steps),
                          "declared": ", ".join(str(b) for b in json.dumps(declared, sort_keys=True).encode())})
