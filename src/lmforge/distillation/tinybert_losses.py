"""TinyBERT's layer mapping and losses (Jiao et al. 2020, section 3.1).

A student of M layers learns from a teacher of N layers through a mapping ``n = g(m)``: student layer m
imitates teacher layer g(m). Index 0 is the embedding layer (g(0) = 0); the paper's default is the uniform
``g(m) = m * N / M`` (every N/M-th teacher layer), which needs N to be a multiple of M::

    embedding   L_embd = MSE(E_S W_e, E_T)                                      eq. 4
    hidden      L_hidn = MSE(H_S W_h, H_T)            per mapped layer m >= 1   eq. 2
    attention   L_attn = 1/h sum_heads MSE(A_S, A_T)  per mapped layer m >= 1   eq. 3
    prediction  L_pred = -softmax(z_T / t) . log_softmax(z_S / t)                eq. 5

``W_e`` and ``W_h`` (d_S -> d_T, learned, no bias as in the paper's ``H_S W_h``) exist only when the widths
differ (:class:`WidthProjections`); with equal widths the states are compared as they are. The layer terms
are summed over the mapped layers (eq. 6 with every lambda = 1).

What counts in the means (TinyBERT's own code sets the masked attention entries to 0 and then averages
over the whole padded (B, H, T, T) tensor and every padded position):

* hidden and embedding states: the real (non-padding) tokens, mean over tokens and the teacher's width;
* attention: ``A`` are the unnormalised scores ``Q K^T / sqrt(d_k)`` before the softmax. Entries the model
  masks (padding keys, future keys of a decoder) are set to 0 in both, as TinyBERT does; the mean is over
  the entries of real query rows whose key the model does not mask, so padding changes neither the sum nor
  the count.

Example:
    >>> uniform_layer_map(12, 4)
    {0: 0, 1: 3, 2: 6, 3: 9, 4: 12}
    >>> parse_layer_map("0:0,1:3,2:6")
    {0: 0, 1: 3, 2: 6}
    >>> import torch
    >>> z = torch.tensor([[0.0, 0.0]])
    >>> round(float(soft_cross_entropy(z, z)), 4)   # two equal classes: log 2
    0.6931
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lmforge.config import ConfigError


def uniform_layer_map(n_teacher: int, n_student: int) -> dict[int, int]:
    """The paper's ``g(m) = m * N / M`` for m = 0..M (0: the embedding layer).

    Raises:
        ConfigError: N is not a multiple of M (or M is not in 1..N), naming both counts.
    """
    if not 0 < n_student <= n_teacher or n_teacher % n_student:
        raise ConfigError(f"the teacher has {n_teacher} layers and the student {n_student}: the uniform layer map "
                          f"g(m) = m * {n_teacher} / {n_student} needs the teacher's count to be a multiple of the "
                          "student's; pass --layer-map (e.g. 0:0,1:3) or another student depth")
    step = n_teacher // n_student
    return {m: m * step for m in range(n_student + 1)}


def parse_layer_map(text: str) -> dict[int, int]:
    """``"0:0,1:3,2:6"`` -> ``{0: 0, 1: 3, 2: 6}`` (student layer : teacher layer).

    Raises:
        ConfigError: not a comma-separated list of ``STUDENT:TEACHER`` integers, or a student layer twice.
    """
    out: dict[int, int] = {}
    for item in text.split(","):
        s, sep, t = item.strip().partition(":")
        if not sep or not s.strip().isdigit() or not t.strip().isdigit():
            raise ConfigError(f"layer_map {text!r}: {item.strip()!r} is not STUDENT:TEACHER (two layer numbers, "
                              "0 = the embeddings), e.g. 0:0,1:3,2:6")
        if int(s) in out:
            raise ConfigError(f"layer_map {text!r}: student layer {int(s)} is mapped twice")
        out[int(s)] = int(t)
    return out


def check_layer_map(mapping: dict[int, int], n_teacher: int, n_student: int) -> dict[int, int]:
    """``mapping`` if it fits a teacher of ``n_teacher`` and a student of ``n_student`` layers.

    Raises:
        ConfigError: a layer past either stack, or the embeddings (0) paired with a transformer layer; the
            message names both counts.
    """
    for m, n in sorted(mapping.items()):
        if m > n_student or n > n_teacher:
            raise ConfigError(f"layer_map {m}:{n} points past a stack: the student has {n_student} layers "
                              f"(0..{n_student}, 0 = embeddings) and the teacher {n_teacher} (0..{n_teacher})")
        if (m == 0) != (n == 0):
            raise ConfigError(f"layer_map {m}:{n}: the embedding layer (0) maps only to the embedding layer; the "
                              f"student has {n_student} layers and the teacher {n_teacher}")
    return dict(sorted(mapping.items()))


class WidthProjections(nn.Module):
    """``W_e`` and ``W_h``: the student's embedding and hidden states (d_S) mapped into the teacher's width
    (d_T); with equal widths there are none and :meth:`embedding`/:meth:`hidden` return their input."""

    def __init__(self, d_student: int, d_teacher: int) -> None:
        super().__init__()
        same = d_student == d_teacher
        self.w_e = None if same else nn.Linear(d_student, d_teacher, bias=False)
        self.w_h = None if same else nn.Linear(d_student, d_teacher, bias=False)

    def embedding(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.w_e is None else self.w_e(x)

    def hidden(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.w_h is None else self.w_h(x)


def state_mse(student: torch.Tensor, teacher: torch.Tensor, real: torch.Tensor | None = None) -> torch.Tensor:
    """MSE of (B, T, D) states (projected to the teacher's width already) over the real tokens ``real`` (B, T)
    bool (None: all); a mean over tokens and D, in fp32."""
    if student.shape != teacher.shape:
        raise ValueError(f"student states {tuple(student.shape)} and teacher states {tuple(teacher.shape)} differ")
    if real is not None:
        student, teacher = student[real], teacher[real]  # (N, D)
    if student.numel() == 0:
        return student.sum() * 0.0
    return F.mse_loss(student.float(), teacher.float())


def attention_score_mse(student: torch.Tensor, teacher: torch.Tensor, real: torch.Tensor | None = None,
                        ) -> torch.Tensor:
    """MSE of (B, H, T, S) attention scores before the softmax (the module docstring says which entries count).

    An entry is compared when the model let the query see the key (its score is above a quarter of the
    dtype's lowest value; the attention writes masked scores at half of it) and, with ``real`` (B, T), the
    query is a real token. The two score tensors have equal head counts (1/h sum over heads of per-head MSEs
    with equal counts is the mean over heads).
    """
    if student.shape != teacher.shape:
        raise ValueError(f"student attention scores {tuple(student.shape)} and teacher scores "
                         f"{tuple(teacher.shape)} differ (heads or lengths)")
    s, t = student.float(), teacher.float()
    seen = (s > torch.finfo(student.dtype).min / 4) & (t > torch.finfo(teacher.dtype).min / 4)  # (B, H, T, S)
    if real is not None:
        seen = seen & real.bool()[:, None, :, None]
    count = seen.sum()
    if not int(count):
        return s.sum() * 0.0
    diff = torch.where(seen, s, 0.0) - torch.where(seen, t, 0.0)  # masked entries: 0 in both, as TinyBERT does
    return diff.pow(2).sum() / count


def soft_cross_entropy(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float = 1.0,
                       ) -> torch.Tensor:
    """``-softmax(z_T / t) . log_softmax(z_S / t)``, a mean over the (N, C) rows (eq. 5; t = 1 in the paper).

    Its gradient in z_S is that of the KL divergence (they differ by the teacher's entropy, a constant).
    """
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(f"student logits {tuple(student_logits.shape)} and teacher logits "
                         f"{tuple(teacher_logits.shape)} must have the same shape")
    if student_logits.shape[0] == 0:
        return student_logits.sum() * 0.0
    p_t = F.softmax(teacher_logits.float() / temperature, dim=-1)  # (N, C)
    log_p_s = F.log_softmax(student_logits.float() / temperature, dim=-1)  # (N, C)
    return -(p_t * log_p_s).sum(-1).mean()
