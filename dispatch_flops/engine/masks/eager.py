"""The per-thread state of attention written as plain ops (``masks.math_path``).

``softmax(q @ k^T * scale + mask) @ v``, op by op: a contraction's last record, the masked
probabilities waiting for their consumer, the last few contractions (for the softmax
backward) and the last causal ``tril``, kept per thread between one op's tally and the next's.
The math path reads and writes it; a shadow tally (``masks.shadows``) reads the last
contraction's scores, to mark scores that a mask without values was added to.
"""

from __future__ import annotations

import threading


class _Eager(threading.local):
    """This thread's attention between one op's tally and the next's."""

    def __init__(self):
        self.scores = None  # (record, numel, last dim, contraction dim) of the last bmm
        # (storage pointers, numel, masked count) of a masked softmax: its output's storage and
        # its casts' (math casts the float32 probabilities to the inputs' half dtype, and may
        # multiply either copy by the contraction that follows)
        self.probs = None
        self.recent: list = []  # the last few bmms' (record, numel, last dim, contraction)
        # the shape of the last boolean ``tril`` (SDPA's math decomposition builds its
        # ``is_causal`` mask with ``ones(s_q, s_k).tril()``), taken by the next softmax
        self.tril = None


EAGER = _Eager()
