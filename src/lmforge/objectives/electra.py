"""ELECTRA's replaced token detection: the batch side (masking, and the noise the generator samples with).

Clark et al., 2020, "ELECTRA: Pre-training Text Encoders as Discriminators Rather Than Generators", §2.
A small masked-LM *generator* fills masked positions with tokens sampled from its softmax; the encoder
being pre-trained, the *discriminator*, then labels every token of that corrupted text as replaced or
original. The discriminator learns from all real tokens instead of only the masked 15%::

    x = [CLS] the chef cooked the meal [SEP]
    mask:       [CLS] [MASK] chef [MASK] the meal [SEP]           objective (this file)
    generator:  samples "the" at 1 and "ate" at 3                  model (lmforge.models.electra)
    corrupted:  [CLS] the chef ate the meal [SEP]
    labels:       0    0   0    1   0   0    0                     1 = replaced; "the" == "the" is original

    L = L_MLM(generator) + lambda * L_RTD(discriminator),  lambda = 50

This objective is BERT's masking (:class:`~lmforge.objectives.mlm.MaskedLM`) with ELECTRA's shares: of the
selected tokens 85% become ``[MASK]`` and 15% stay unchanged, none is swapped for a random token (the
generator supplies the replacements); see ``pretrain_helpers.mask`` in the paper's code. It adds one thing,
``sampling_noise``: a uniform number per position, with which the model draws the generator's sample by
inverse-CDF (:func:`lmforge.models.electra.sample_tokens`). Drawing it here, from the objective's seeded
generator, makes the replacements a function of the objective's state: a resumed run draws the same ones,
and splitting a batch into micro-batches does not change them.

``generator_size``, ``rtd_weight`` and ``tie_generator_output`` are the recipe's model-side settings (the
generator's width as a fraction of the discriminator's, lambda, and whether the generator's MLM output matrix
is the shared token table); they ride here so that ``--objective-option`` reaches them, and
:func:`lmforge.training.pretrain.build_pretraining` hands them to :class:`~lmforge.models.electra.ElectraPretrainer`.

Batch layout (all (B, T), right-padded)::

    input_ids       [CLS] x [SEP] with the selected tokens masked (or kept)
    attention_mask  1 on real tokens
    labels          the original id at the selected positions, -100 elsewhere (the generator's MLM targets)
    sampling_noise  U[0, 1) float per position (read at the selected positions only)

Example::

    >>> rtd = ReplacedTokenDetection(vocab_size=100, mask_token_id=3, pad_token_id=0, cls_token_id=1,
    ...                              sep_token_id=2, add_cls_sep=True, seed=0)
    >>> batch = rtd([[10, 11, 12, 13], [14, 15]])
    >>> sorted(batch), tuple(batch["sampling_noise"].shape)
    (['attention_mask', 'input_ids', 'labels', 'sampling_noise'], (2, 6))
    >>> selected = batch["labels"] != -100
    >>> bool(torch.isin(batch["input_ids"][selected], torch.tensor([3, *range(10, 16)])).all())  # [MASK] or kept
    True
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lmforge.objectives.mlm import MaskedLM, with_mlm_options


class ReplacedTokenDetection(MaskedLM):
    """ELECTRA's collator: MLM masking (85% ``[MASK]``, 15% kept, 0% random) plus ``sampling_noise``.

    Args:
        generator_size: the generator's hidden size, heads and FFN width as a fraction of the
            discriminator's (the paper's 1/4 for small models; 1.0 = same size), in (0, 1].
        rtd_weight: lambda, the weight of the discriminator's loss in the joint loss (paper: 50).
        tie_generator_output: the generator's MLM output matrix is the shared token table (the paper's
            setting); False gives it its own, which keeps a short run from degenerating the shared table
            (see :mod:`lmforge.models.electra`).
        mask_prob, random_prob: as in :class:`MaskedLM`, with ELECTRA's defaults.
        **mlm_options: any other :class:`MaskedLM` argument (ids, ``mlm_probability``, whole-word, span and
            static masking, ``seed``); the signature lists them, so ``lmforge pretrain`` fills them by name.
    """

    def __init__(
        self,
        *,
        mask_prob: float = 0.85,
        random_prob: float = 0.0,
        generator_size: float = 0.25,
        rtd_weight: float = 50.0,
        tie_generator_output: bool = True,
        **mlm_options,
    ):
        super().__init__(mask_prob=mask_prob, random_prob=random_prob, **mlm_options)
        if not 0.0 < generator_size <= 1.0:
            raise ValueError(f"generator_size must be in (0, 1] (a fraction of the discriminator's width), "
                             f"got {generator_size}")
        if rtd_weight < 0:
            raise ValueError(f"rtd_weight must be >= 0, got {rtd_weight}")
        self.generator_size = float(generator_size)
        self.rtd_weight = float(rtd_weight)
        self.tie_generator_output = bool(tie_generator_output)

    def __call__(self, examples: Sequence) -> dict[str, torch.Tensor]:
        batch = super().__call__(examples)
        # Drawn after the masks, from the same generator: one number per position keeps the draw independent
        # of how many positions the masks happened to select.
        batch["sampling_noise"] = torch.rand(batch["input_ids"].shape, generator=self.generator)  # (B, T)
        return batch

    def pretrainer_options(self) -> dict[str, float | bool]:
        """The settings :class:`~lmforge.models.electra.ElectraPretrainer` takes from the recipe."""
        return {"generator_size": self.generator_size, "rtd_weight": self.rtd_weight,
                "tie_generator_output": self.tie_generator_output}


with_mlm_options(ReplacedTokenDetection)
