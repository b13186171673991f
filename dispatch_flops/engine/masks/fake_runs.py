"""The compiled graphs being counted on fake tensors now: their fake runs, innermost last.

``engine.graphs.compiled`` pushes a graph's fake run (a ``counting.flex.FakeRun``: its fake
inputs and the tallies it found) while it counts the graph on fake tensors, and pops it after;
the mask tallies here (``sdpa``, ``math_path``, ``shadows``), FlexAttention's rule
(``counting.flex``) and the mode read the innermost one. Masks built from shapes on fake tensors
are followed as on meta only while a fake run is on.
"""

FAKE_RUNS: list = []
