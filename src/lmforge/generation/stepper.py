"""Feeding a model one token per sequence at a time: the prompt once, then each new token over a KV cache.

    decoder          prompt (left-padded) -> [causal stack, cache] -> logits of token 1
                     token t              -> [causal stack, cache] -> logits of token t+1
    encoder-decoder  source -> encoder, once -> memory (cross-attention K/V cached at the first step)
                     start token, token t -> [decoder + cross-attn, cache] -> logits

Left padding keeps every row's newest token in the same column, so one cache serves the batch. Each
row's positions count only its real tokens (``cumsum(mask) - 1``): the first real token is position 0
whatever the padding, which is what learned and rotary positions need; ALiBi, T5 and Shaw biases
depend on key - query offsets, which padding on the left does not change. Pad keys are masked.

When nothing is padded the steps pass no mask, so the model takes its mask-free kernels, and the
positions are slices of one shared range: the per-token path stays as short as it can be.

``tokens`` (N, L) holds every sequence so far (decoders: the prompt, encoder-decoders: the start
token) followed by the generated tokens; ``valid`` marks the real ones for the logits processors.

Example:
    >>> import torch, lmforge
    >>> model = lmforge.build_model("gpt-tiny").eval()
    >>> stepper = Stepper(model, torch.tensor([[5, 6, 7]]), None, max_new_tokens=2, start_id=0, pad_id=0)
    >>> logits = stepper.prefill()                       # (N, V) for the first new token
    >>> logits = stepper.step(logits.argmax(-1))         # feeds it, returns the next (N, V)
    >>> stepper.tokens.shape, stepper.length
    (torch.Size([1, 5]), 4)
"""

from __future__ import annotations

import torch

from lmforge.nn.kv_cache import KVCache


def pack(
    input_ids: torch.Tensor | list[list[int]], attention_mask: torch.Tensor | None, pad_id: int, side: str = "left"
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Sequences as a (B, T) batch padded on ``side``, and its (B, T) bool mask (None when nothing is padded).

    Accepts ragged lists of ids, or a tensor with a mask padded anywhere: rows are re-packed so that their
    real tokens end in the last column (``left``: decoder prompts) or start in the first (``right``:
    encoder sources, whose absolute positions must start at 0).
    """
    if not isinstance(input_ids, torch.Tensor):
        rows = list(input_ids)
        if not rows:
            raise ValueError("no prompts given")
        rows = [[int(t) for t in r] for r in ([rows] if isinstance(rows[0], int) else rows)]  # one flat prompt
        width = max(len(r) for r in rows)
        input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
        attention_mask = torch.zeros(len(rows), width, dtype=torch.bool)
        for b, r in enumerate(rows):
            if r:
                input_ids[b, :len(r)] = torch.tensor(r)
                attention_mask[b, :len(r)] = True
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
        attention_mask = attention_mask[None] if attention_mask is not None else None
    if attention_mask is None or bool(attention_mask.bool().all()):
        return input_ids, None
    mask = attention_mask.bool()
    # A stable sort on the mask moves every pad to one side and keeps the real tokens' order.
    key = mask.int() if side == "left" else (~mask).int()
    order = torch.sort(key, dim=1, stable=True).indices
    return input_ids.gather(1, order).masked_fill(~mask.gather(1, order), pad_id), mask.gather(1, order)


class Stepper:
    """Runs ``model`` incrementally for generation (see the module docstring).

    Args:
        model: an lmforge Transformer with an LM head (decoder or encoder-decoder).
        input_ids: (B, T) prompts (decoders, left-padded) or sources (encoder-decoders).
        attention_mask: (B, T) bool, or None when nothing is padded.
        max_new_tokens: tokens that will be generated at most (sizes the buffers and the cache).
        start_id: first decoder token of an encoder-decoder.
        pad_id: fills the token buffer beyond the current length.
        use_cache: False re-runs the whole prefix at every step (the reference for the cached path).
    """

    def __init__(
        self,
        model,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        max_new_tokens: int,
        start_id: int,
        pad_id: int,
        use_cache: bool = True,
    ):
        self.model = model
        self.encoder_decoder = model.config.arch == "encoder-decoder"
        B, device = input_ids.shape[0], input_ids.device
        self.memory = self.source_mask = None
        if self.encoder_decoder:
            self.source_mask = attention_mask
            self.memory, _ = model.encode(input_ids, attention_mask)  # (B, S, D), once for all steps
            prompt, prompt_mask = torch.full((B, 1), start_id, dtype=torch.long, device=device), None
        else:
            prompt, prompt_mask = input_ids, attention_mask
        T0 = prompt.shape[1]
        self.prompt_len = self.length = T0
        self.tokens = torch.full((B, T0 + max_new_tokens), pad_id, dtype=torch.long, device=device)  # (N, L_max)
        self.tokens[:, :T0] = prompt
        self.valid = torch.ones_like(self.tokens, dtype=torch.bool)  # (N, L_max)
        self.padded = prompt_mask is not None
        if self.padded:
            self.valid[:, :T0] = prompt_mask
            self.positions = (self.valid.long().cumsum(-1) - 1).clamp(min=0)  # (N, L_max)
        else:  # shared by all rows; slicing it each step is cheaper than the model's own arange
            self.positions = torch.arange(T0 + max_new_tokens, device=device)[None]  # (1, L_max)
        self.cache = KVCache(capacity=T0 + max_new_tokens, window=model.config.sliding_window) if use_cache else None

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    def prefill(self) -> torch.Tensor:
        """Run the prompt (decoders) or the start token (encoder-decoders): logits (N, V) of the next token."""
        return self._forward(0)

    def step(self, tokens: torch.Tensor, forward: bool = True) -> torch.Tensor | None:
        """Append ``tokens`` (N,) to every sequence; return the logits (N, V) after them, unless not ``forward``."""
        self.tokens[:, self.length] = tokens
        self.length += 1
        if not forward:
            return None
        return self._forward(self.length - 1 if self.cache is not None else 0)

    def select(self, index: torch.Tensor, same_source: bool = False) -> None:
        """Keep rows ``index`` (N',) in this order: repeat prompts, or follow surviving beams.

        ``same_source``: every row moves within its own prompt's group (beam search), so the prompt
        mask, positions and encoder memory, equal within a group, are left as they are.
        """
        self.tokens = self.tokens.index_select(0, index)
        if self.cache is not None:
            self.cache.reorder(index)
        if same_source:
            return
        self.valid = self.valid.index_select(0, index)
        if self.padded:
            self.positions = self.positions.index_select(0, index)
        if self.memory is not None:
            self.memory = self.memory.index_select(0, index)
            if self.source_mask is not None:
                self.source_mask = self.source_mask.index_select(0, index)

    def _forward(self, start: int) -> torch.Tensor:
        """Logits (N, V) at the last position, feeding ``tokens[:, start:length]``."""
        L = self.length
        # positions of the new tokens (N|1, T); logits at the last one only
        kwargs = {"position_ids": self.positions[:, start:L], "logits_to_keep": 1}
        if self.cache is not None:
            kwargs.update(past_key_values=self.cache, use_cache=True)
        if self.padded:  # covers cached and new keys
            kwargs["attention_mask"] = self.valid[:, :L]
        ids = self.tokens[:, start:L]
        if self.encoder_decoder:
            out = self.model(decoder_input_ids=ids, attention_mask=self.source_mask,
                             encoder_hidden_states=self.memory, **kwargs)
        else:
            out = self.model(ids, **kwargs)
        return out.logits[:, -1]  # (N, V)
