"""Logits processors: penalties that apply to every strategy, and the sampling filters.

Each function maps next-token scores (N, V) to new scores; a filter sets the tokens it removes to
-inf. ``history`` (N, L) holds each sequence so far (the prompt included for decoders, the start
token included for encoder-decoders) and ``valid`` (N, L) marks its real tokens, so left padding
never counts as text.

    repetition_penalty  l -> l / p if l > 0 else l * p, for every token already in the sequence
    no_repeat_ngram     -inf for any token that would repeat an n-gram of the sequence
    temperature         l -> l / t
    top_k               keep the k highest scores (ties with the k-th kept)
    top_p               keep the smallest set of most likely tokens whose probability sums to >= p
    min_p               keep tokens with probability >= min_p * (probability of the most likely)

``LogitsPipeline`` chains them in HF's order: penalties first, then temperature, top-k, top-p, min-p.

Example:
    >>> import torch
    >>> scores = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    >>> top_k_filter(scores, 2)
    tensor([[2., 1., -inf, -inf]])
    >>> history = torch.tensor([[0, 3]])
    >>> repetition_penalty(scores, history, torch.ones_like(history, dtype=torch.bool), 2.0)
    tensor([[ 1.,  1.,  0., -2.]])
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lmforge.generation.config import GenerationConfig


def repetition_penalty(
    scores: torch.Tensor, history: torch.Tensor, valid: torch.Tensor, penalty: float
) -> torch.Tensor:
    """Penalise every token id present in ``history`` once (not once per occurrence): (N, V) -> (N, V)."""
    V = scores.shape[-1]
    # Padding (and ids beyond the head's vocabulary) go to a spare column that is dropped after.
    ids = history.masked_fill(~valid, V).clamp(max=V)  # (N, L)
    padded = F.pad(scores, (0, 1))  # (N, V + 1)
    seen = padded.gather(1, ids)
    seen = torch.where(seen < 0, seen * penalty, seen / penalty)
    return padded.scatter(1, ids, seen)[:, :V]


def no_repeat_ngram_mask(history: torch.Tensor, valid: torch.Tensor, n: int, vocab_size: int) -> torch.Tensor:
    """(N, L) sequences -> (N, V) bool, True for tokens that would complete an n-gram seen before.

    The next token completes the n-gram ``history[-(n-1):] + [token]``; it is banned when some earlier
    window of n real tokens starts with the same n-1 tokens, in which case its last token is banned.
    """
    N, L = history.shape
    banned = torch.zeros(N, vocab_size + 1, dtype=torch.bool, device=history.device)
    if L < n:
        return banned[:, :vocab_size]
    windows = history.unfold(1, n, 1)  # (N, L - n + 1, n)
    real = valid.unfold(1, n, 1).all(-1)  # (N, W): windows that contain no padding
    prefix = history[:, L - n + 1:]  # (N, n - 1): the last n-1 tokens
    # With n = 1 the prefix is empty and every window matches: each token present is banned.
    matches = (windows[..., :-1] == prefix[:, None]).all(-1) & real  # (N, W)
    last = windows[..., -1].clamp(max=vocab_size).masked_fill(~matches, vocab_size)
    return banned.scatter_(1, last, True)[:, :vocab_size]


def top_k_filter(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k highest scores per row (and any tied with the k-th): (N, V) -> (N, V)."""
    k = min(k, scores.shape[-1])
    kth = scores.topk(k, dim=-1).values[..., -1:]  # (N, 1)
    return scores.masked_fill(scores < kth, float("-inf"))


def top_p_filter(scores: torch.Tensor, p: float) -> torch.Tensor:
    """Nucleus filter (Holtzman et al. 2020): keep the smallest set of most likely tokens whose total
    probability is >= p; the most likely token is always kept. (N, V) -> (N, V)."""
    ascending, order = scores.sort(dim=-1)  # least likely first
    mass_below = ascending.softmax(-1).cumsum(-1)  # (N, V): probability of this token and all below
    # A token is dropped when everything up to and including it fits in the 1 - p tail.
    drop = mass_below <= 1 - p
    drop[..., -1] = False
    return scores.masked_fill(drop.scatter(-1, order, drop), float("-inf"))


def min_p_filter(scores: torch.Tensor, min_p: float) -> torch.Tensor:
    """Min-p (Nguyen et al. 2024): drop tokens whose probability is below ``min_p`` times the most
    likely token's probability; the most likely token is always kept. (N, V) -> (N, V)."""
    probs = scores.softmax(-1)
    drop = probs < min_p * probs.amax(-1, keepdim=True)
    drop.scatter_(-1, probs.argmax(-1, keepdim=True), False)
    return scores.masked_fill(drop, float("-inf"))


class LogitsPipeline:
    """The processors a config asks for, applied in HF's order.

    Args:
        config: the generation settings.
        sampling: also apply temperature, top-k, top-p and min-p (only sampling uses them).

    Call with scores (N, V) float32 and the sequences so far, ``history``/``valid`` (N, L).
    """

    def __init__(self, config: GenerationConfig, sampling: bool):
        self.penalty = config.repetition_penalty if config.repetition_penalty != 1.0 else None
        self.ngram = config.no_repeat_ngram_size or None
        self.temperature = config.temperature if sampling and config.temperature != 1.0 else None
        self.top_k = config.top_k if sampling and config.top_k else None
        self.top_p = config.top_p if sampling and config.top_p < 1.0 else None
        self.min_p = config.min_p if sampling and config.min_p else None

    def __bool__(self) -> bool:
        return any(x is not None for x in (self.penalty, self.ngram, self.temperature, self.top_k, self.top_p,
                                           self.min_p))

    def __call__(self, scores: torch.Tensor, history: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        if self.penalty is not None:
            scores = repetition_penalty(scores, history, valid, self.penalty)
        if self.ngram is not None:
            scores = scores.masked_fill(no_repeat_ngram_mask(history, valid, self.ngram, scores.shape[-1]),
                                        float("-inf"))
        if self.temperature is not None:
            scores = scores / self.temperature
        if self.top_k is not None:
            scores = top_k_filter(scores, self.top_k)
        if self.top_p is not None:
            scores = top_p_filter(scores, self.top_p)
        if self.min_p is not None:
            scores = min_p_filter(scores, self.min_p)
        return scores
