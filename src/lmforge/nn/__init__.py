"""Building blocks, one concept per file: attention, masks, KV cache, positions, norms, FFN, block."""
