"""Compiled graphs and CUDA graphs, counted as they run.

``dynamo``: the hook that wraps every graph dynamo compiles, and compiled models never left
de-compiled; ``compiled``: a graph priced once on fake tensors, its counts added at each run;
``runs``: how a priced graph runs (counting modes off the stack, its backward counted once);
``cuda_graphs``: a CUDA graph's captured counts added at each replay.
"""
