"""What follows the trunk in an embedding or reranking file (a file with a
`{arch}.pooling_type`, read into TextParams.pooling): each sequence's pooling (mean, CLS,
last token; `rank` for rerankers), then EmbeddingGemma's dense projections (dense_2,
dense_3) or a reranker's classification head as llama.cpp builds it: RoBERTa's dense
layer and tanh (`cls`, bge-reranker), then the projection to the labels (`cls.output`:
BertForSequenceClassification's classifier, Qwen3-Reranker's yes/no rows, whose
softmax's first is the score). engine.embed runs it over a batch."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...gguf_io import Keys
from ..errors import WeightError
from ..modules import Weights
from .params import TextParams


@dataclass
class PoolingHead:
    """Pooling and what follows it."""

    pooling: str
    dense: list  # linear layers applied in order after pooling (EmbeddingGemma's dense_2, dense_3)
    classifier: object = None  # rerankers: cls.output (labels x hidden)
    softmax: bool = False  # the classifier's outputs as probabilities (Qwen3-Reranker)
    dense_tanh: object = None  # rerankers with RoBERTa's head: cls (hidden x hidden), then tanh
    gelu_norm: torch.Tensor | None = None  # ModernBERT's head: GELU instead of tanh, then this LayerNorm weight
    rank_mean: bool = False  # a reranker pooling the mean of its tokens (ModernBERT's classifier pooling)
    eps: float = 1e-5  # gelu_norm's

    @classmethod
    def build(cls, p: TextParams, w: Weights) -> "PoolingHead | None":
        """The head of a file with a pooling type (its tensors checked), else None."""
        if p.pooling is None:
            return None
        dense, width = [], p.hidden
        for name, out in p.pool_dense:
            dense.append(w.linear(f"{name}.weight", out, width, bias=f"{name}.bias"))
            width = out
        classifier = head = None
        if p.pooling == "rank":
            if not w.has("cls.output.weight") and not w.has("cls.weight"):
                raise WeightError(f"{w.reader.path}: a rank (reranker) file needs its classifier, cls.output.weight "
                                  "or cls.weight")
            if w.has("cls.weight"):
                out = w.info("cls.weight").shape[0]
                head = w.linear("cls.weight", out, width, bias="cls.bias" if w.has("cls.bias") else None)
                width = out
            if w.has("cls.output.weight"):
                labels = w.info("cls.output.weight").shape[0]
                classifier = w.linear("cls.output.weight", labels, width,
                                      bias="cls.output.bias" if w.has("cls.output.bias") else None)
        modern = w.reader.architecture == "modern-bert"
        norm = w.vector("cls.norm.weight", width) if modern and head is not None and w.has("cls.norm.weight") else None
        pooling = w.reader.metadata.get(Keys.CLASSIFIER_POOLING_TYPE.format(arch=w.reader.architecture))
        return cls(p.pooling, dense, classifier, softmax=p.pooling == "rank" and p.rank_softmax, dense_tanh=head,
                   gelu_norm=norm if modern else None, rank_mean=modern and pooling in (None, 1), eps=p.eps)

    def pool(self, hidden: torch.Tensor, causal: bool) -> torch.Tensor:
        """One sequence's pooled vector from its tokens' outputs (n, hidden)."""
        if self.pooling == "mean" or (self.pooling == "rank" and self.rank_mean):
            return hidden.mean(0)
        if self.pooling == "cls":
            return hidden[0]
        return hidden[-1] if causal or self.pooling == "last" else hidden[0]  # rank: last, or CLS where both ways

    def __call__(self, pooled: torch.Tensor) -> torch.Tensor:
        x = pooled
        for layer in self.dense:
            x = layer(x)
        if self.dense_tanh is not None and self.gelu_norm is not None:
            h = torch.nn.functional.gelu(self.dense_tanh(x).float())
            x = torch.nn.functional.layer_norm(h, self.gelu_norm.shape, self.gelu_norm.float(), None, self.eps)
        elif self.dense_tanh is not None:
            x = torch.tanh(self.dense_tanh(x).float())
        if self.classifier is not None:
            x = self.classifier(x).float()
            return torch.softmax(x, -1) if self.softmax else x
        return x.float()
