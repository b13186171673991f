"""Counting: every aten op into an op record of the module frame that ran it.

``mode``: the dispatch mode (``CountingMode``), the hot path, and the one owner of a mode's
attributes; ``tracker``: the running frame, from module and optimizer hooks (``steps``, and
``step_replay`` for steps that repeat); ``state``: what counting changes, each part with its
writers; ``ledger``: frames, phases and the records they hold; ``records``: an op record, its
``Signature`` and how records become rows; ``calls``: how a call is keyed and what the mode
knows of an overload (``Resolved``); ``active``: the counters counting now; ``exotic``,
``nested``, ``dtensor``, ``meta``: sparse and symbolic tensors, jagged ones, DTensor's logical
figure, the meta device; ``flex``: FlexAttention's operators, counted whole; ``model_cache``:
what a model's walk found, kept per model; ``skip``: dynamo's frame skip. It stands on
``masks`` (the tallies it looks up) and names a timer by what it reads of it (``ledger.Clock``).
"""
