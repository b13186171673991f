"""The engine: counting. A folder a room; torch's private APIs (``torch_private``) serve all.

``counting``: the dispatch mode, the module tracker and the state they share, the ledger of
op records and how a call is keyed; ``timing``: clocks, Kineto's kernel times and the join,
the timeline, the timer factory; ``masks``: attention's mask tallies and FlexAttention;
``graphs``: compiled graphs (dynamo's hook, pricing, runs) and CUDA graphs; ``model``: facts
read from the model (module facts, expert load, saved activations, module outputs). It
imports ``results`` (the types it fills) and the formula library, never views.
"""
