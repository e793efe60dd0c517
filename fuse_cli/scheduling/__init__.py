"""Memory-aware node order: the same operators and values, stored in an order with a lower peak.

Of two branches that meet in a Concat or an Add, the one run first keeps its output alive while the
other runs: running first the branch with the larger transient, leaving the smaller output, lowers
the peak. Which order runs depends on the runtime: onnxruntime's DEFAULT order is a reverse
depth-first walk steered by the stored indices (walks.py); most other runtimes run the stored
order as it is. The search (search.py) builds candidates, each for one rule or both:
1. Liu's rule over walks (walks.liu_walk): optimal on trees, linear time;
2. Serenity's dynamic program over run sets (program.py): exact among orders that keep chains
   contiguous, under the search's sizing, while its layers fit the beam; a beam search beyond;
3. a local search over walks from the better of those (walks.improve_walk),
and judges each by the memory model (the peak guard's estimate at every shape setting it uses),
never keeping an order worse anywhere or better by less than the estimate can vouch for.
"""

from fuse_cli.scheduling.search import (MIN_GAIN_BYTES, PEAK_TOLERANCE_FRACTION, PEAK_TOLERANCE_MIN_BYTES, RULES, Judge,
                                        Scheduled, execution_order, gain_needed, memory_judge, peak_tolerance, reorder,
                                        schedule)

__all__ = ["MIN_GAIN_BYTES", "PEAK_TOLERANCE_FRACTION", "PEAK_TOLERANCE_MIN_BYTES", "RULES", "Judge", "Scheduled",
           "execution_order", "gain_needed", "memory_judge", "peak_tolerance", "reorder", "schedule"]
