"""Knowledge-distillation losses (Hinton et al. 2015; DistilBERT, Sanh et al. 2019).

A student learns from a teacher's *soft targets*: the teacher's distribution softened at temperature T,
``p_t = softmax(z_t / T)``, carries how the teacher ranks the wrong answers too ("dark knowledge")::

    soft_target_kl(z_s, z_t, T)   = T^2 * mean_rows KL(softmax(z_t/T) || softmax(z_s/T))
    cosine_embedding_loss(h_s, h_t) = mean_rows (1 - cos(h_s, h_t))

The T^2 factor keeps the soft term's gradient the same size whatever T is: d/dz_s of the KL scales as 1/T^2
(Hinton et al. 2015, section 2), so without it a higher temperature would silently shrink the term.

DistilBERT's pre-training loss is the weighted sum of three terms, each a mean over its own positions::

    L = alpha_ce * soft_target_kl(student logits, teacher logits, T)   over real (non-padding) tokens
      + alpha_mlm * MLM cross-entropy                                  over the masked tokens
      + alpha_cos * cosine_embedding_loss(last hidden states)          over real tokens

with alpha_ce = 5, alpha_mlm = 2, alpha_cos = 1 and T = 2 in DistilBERT's training (:func:`weighted_sum`).
Task distillation (Hinton's recipe on a fine-tuned classifier) mixes the soft term with the gold labels::

    L = alpha * soft_target_kl(z_s, z_t, T) + (1 - alpha) * CE(z_s, gold)

Example:
    >>> import torch
    >>> z = torch.tensor([[2.0, 0.5, -1.0]])
    >>> float(soft_target_kl(z, z, temperature=2.0))          # the same distribution: nothing to learn
    0.0
    >>> round(float(cosine_embedding_loss(torch.ones(2, 4), -torch.ones(2, 4))), 4)   # opposite: 1 - (-1)
    2.0
    >>> float(weighted_sum({"ce": torch.tensor(1.0), "cos": torch.tensor(3.0)}, {"ce": 5.0, "cos": 1.0}))
    8.0
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def soft_target_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``T^2 * KL(softmax(teacher/T) || softmax(student/T))``, averaged over the rows.

    Args:
        student_logits, teacher_logits: (N, C) logits of the same N positions (computed in fp32 here, also
            under bf16 autocast: a softened distribution over a vocabulary has many tiny probabilities).
        temperature: T > 0; 1 compares the plain distributions.

    Returns:
        A scalar; 0 for N = 0.
    """
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(f"student logits {tuple(student_logits.shape)} and teacher logits "
                         f"{tuple(teacher_logits.shape)} must have the same shape")
    if student_logits.shape[0] == 0:
        return student_logits.sum() * 0.0
    log_p_s = F.log_softmax(student_logits.float() / temperature, dim=-1)  # (N, C)
    log_p_t = F.log_softmax(teacher_logits.float() / temperature, dim=-1)  # (N, C)
    kl = (log_p_t.exp() * (log_p_t - log_p_s)).sum(-1)  # (N,) KL(p_t || p_s) of each row
    return kl.mean() * temperature**2


def cosine_embedding_loss(student_states: torch.Tensor, teacher_states: torch.Tensor) -> torch.Tensor:
    """``mean(1 - cos(h_s, h_t))`` over the rows of (N, D) hidden states: DistilBERT's alignment of the
    directions of student and teacher states (torch's CosineEmbeddingLoss with every target 1)."""
    if student_states.shape[0] == 0:
        return student_states.sum() * 0.0
    cos = F.cosine_similarity(student_states.float(), teacher_states.float(), dim=-1)  # (N,)
    return (1.0 - cos).mean()


def weighted_sum(terms: dict[str, torch.Tensor], weights: dict[str, float]) -> torch.Tensor:
    """``sum_k weights[k] * terms[k]`` over the terms with a nonzero weight (a term may be left out then)."""
    used = [weights[k] * terms[k] for k in weights if weights[k]]
    if not used:
        raise ValueError("every loss weight is zero: nothing to train on")
    return torch.stack(used).sum()


def task_distillation_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, gold_loss: torch.Tensor,
                           alpha: float, temperature: float) -> torch.Tensor:
    """``alpha * soft_target_kl(student, teacher, T) + (1 - alpha) * gold_loss``; logits (B, C), gold_loss the
    student's cross-entropy with the gold labels (a scalar, mean over the same B examples)."""
    soft = soft_target_kl(student_logits, teacher_logits, temperature) if alpha else gold_loss * 0.0
    return alpha * soft + (1.0 - alpha) * gold_loss
