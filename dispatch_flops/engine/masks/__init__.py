"""Masked pairs: mask values that no formula sees (attention's masks, FlexAttention's).

``tally``: a record's masked and skipped pairs (``Tally``), a pair's rate, a mask's entries
counted. ``sdpa``: SDPA's kernels, whose mask is an argument. ``eager``: the per-thread state
of attention written as plain ops. ``math_path``: that attention (transformers' eager
attention, SDPA's math decomposition) followed from op to op, forward and backward.
``dropout``: dropout's noise, from its draw to its products. ``shadows``: masks built from
shapes on meta and fake tensors, valued on the CPU, and a compiled graph's masks made from its
inputs, counted at each run. ``op_tallies``: each op's tally, the mode's lookup.
``fake_runs``: the compiled graphs being counted on fake tensors now. It imports no other room
of the engine: counting looks its tallies up (FlexAttention's rule, ``counting.flex``, too).
"""
