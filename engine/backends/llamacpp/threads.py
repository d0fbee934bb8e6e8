"""How many CPU threads llama.cpp uses: one CPU is left to other programs, so a busy desktop does not stall it.

llama.cpp's threads meet at a barrier after every graph node and wait there
by spinning (OpenMP's barrier, or ggml's own). A decode step is hundreds of
tiny nodes; when one thread shares its core with another program (a browser,
a build, this app's own window thread), every barrier waits for the
scheduler to give that thread a slice. Measured with bench/threads.py on a
2-core machine (shared with other work), the default model, a Python busy
loop on one core beside it (tok/s):

    threads   decode alone   decode busy   prompt alone   prompt busy
    1         94-100         90-100        205            130-203
    2         175 (quiet)    1.4-26        330-387        62-174

A prompt's nodes are long matrix products that idle threads share out, so
prompts suffer less, but they still fall below one thread's speed. So both
use one thread fewer than the CPUs this process may run on (at most the
physical cores, at least one): the other program's core stays free and no
barrier waits on it. On a machine with SMT the physical cores are already
fewer than the logical CPUs, so the siblings take the other programs and
every physical core is used. On an idle machine this costs one core's share
(half on 2 cores, an eighth on 8); beside a busy one it is the difference
between a few and a hundred tokens a second.
`n_threads` / `n_threads_batch` override it (the prompt's follows the decode's
when only that is given, as in llama.cpp).

That static count is where a model starts; when the user chose no count, each answer then runs on the
cores free at its start (engine/cpu_load.py: every physical core when the machine is idle, fewer beside
busy programs), and looks again between its decode steps (`LlamaCppBackend._follow_free_cores`), so an
idle machine is not left a core short.
"""

from __future__ import annotations

# No llama_cpp import here: the window can show the default without loading llama.cpp.
from engine.cpu_load import physical_cores, usable_cpus

__all__ = ["RECHOOSE_EVERY_S", "choose_threads", "default_threads", "physical_cores", "usable_cpus"]

# How often a run's decode steps look at the free cores again (`LlamaCppBackend._follow_free_cores`, the batch
# runner's steps), reading this last stretch only (one of the load monitor's sampling periods): a burst before
# the answer is gone from it a quarter second in. Measured with bench/serve.py (its client a fresh process):
# every 0.5 s, 0.78; every 0.25 s, 0.80.
RECHOOSE_EVERY_S = 0.25


def choose_threads(physical: int, logical: int) -> int:
    """llama.cpp's threads for `physical` cores and `logical` usable CPUs: one CPU left free, at most the cores."""
    return max(1, min(physical, logical - 1))


def default_threads() -> int:
    """llama.cpp's threads on this machine (decode and prompt)."""
    return choose_threads(physical_cores(), usable_cpus())
