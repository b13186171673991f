"""Model factories for the command-line tests (``dispatch-flops tests/cli_models.py:NAME``)."""

from torch import nn


def small_cnn() -> nn.Module:
    """Input [b, 3, h, w]."""
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 10),
    )


class TokenOutput:
    """Stands in for a HuggingFace ModelOutput: the tensor is under ``logits``."""

    def __init__(self, logits):
        self.logits = logits


class TinyLM(nn.Module):
    """Input token ids [b, s]; returns an object with ``logits`` [b, s, vocab]."""

    def __init__(self, vocab: int = 16, width: int = 8):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.head = nn.Linear(width, vocab)

    def forward(self, ids):
        return TokenOutput(self.head(self.embed(ids)))


def broken() -> nn.Module:
    raise ValueError("this factory always fails")


def not_a_model():
    return 42


def with_dropout() -> nn.Module:
    """Input [b, 8]; dropout runs ops in train mode only."""
    return nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5), nn.Linear(8, 2))
