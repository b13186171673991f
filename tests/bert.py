"""A BERT-base-shaped encoder, written from the architecture (module names as in HF BERT)."""

import math

import torch
from torch import nn


class BertSelfAttention(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.query, self.key, self.value = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x):
        b, s, d = x.shape

        def split(t):  # [b, s, d] -> [b, heads, s, d/heads]
            return t.view(b, s, self.heads, d // self.heads).transpose(1, 2)

        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        scores = q @ k.transpose(-1, -2) / math.sqrt(d // self.heads)
        return (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, d)


class BertSelfOutput(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.dense, self.LayerNorm = nn.Linear(d, d), nn.LayerNorm(d)

    def forward(self, h, x):
        return self.LayerNorm(self.dense(h) + x)


class BertAttention(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.self, self.output = BertSelfAttention(d, heads), BertSelfOutput(d)

    def forward(self, x):
        return self.output(self.self(x), x)


class BertIntermediate(nn.Module):
    def __init__(self, d, ff):
        super().__init__()
        self.dense = nn.Linear(d, ff)

    def forward(self, x):
        return nn.functional.gelu(self.dense(x))


class BertOutput(nn.Module):
    def __init__(self, d, ff):
        super().__init__()
        self.dense, self.LayerNorm = nn.Linear(ff, d), nn.LayerNorm(d)

    def forward(self, h, x):
        return self.LayerNorm(self.dense(h) + x)


class BertLayer(nn.Module):
    def __init__(self, d, heads, ff):
        super().__init__()
        self.attention = BertAttention(d, heads)
        self.intermediate, self.output = BertIntermediate(d, ff), BertOutput(d, ff)

    def forward(self, x):
        a = self.attention(x)
        return self.output(self.intermediate(a), a)


class BertEncoder(nn.Module):
    def __init__(self, d, heads, ff, layers):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(d, heads, ff) for _ in range(layers))

    def forward(self, x):
        for layer in self.layer:
            x = layer(x)
        return x


class BertEmbeddings(nn.Module):
    def __init__(self, vocab, d, positions, types):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, d)
        self.position_embeddings = nn.Embedding(positions, d)
        self.token_type_embeddings = nn.Embedding(types, d)
        self.LayerNorm = nn.LayerNorm(d)

    def forward(self, ids):
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.word_embeddings(ids) + self.position_embeddings(pos)
        return self.LayerNorm(x + self.token_type_embeddings(torch.zeros_like(ids)))


class BertPooler(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.dense = nn.Linear(d, d)

    def forward(self, x):
        return torch.tanh(self.dense(x[:, 0]))


class BertModel(nn.Module):
    def __init__(self, vocab=30522, d=768, heads=12, ff=3072, layers=12, positions=512, types=2):
        super().__init__()
        self.embeddings = BertEmbeddings(vocab, d, positions, types)
        self.encoder = BertEncoder(d, heads, ff, layers)
        self.pooler = BertPooler(d)

    def forward(self, ids):
        return self.pooler(self.encoder(self.embeddings(ids)))
