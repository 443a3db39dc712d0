"""What runs cost and how to spend compute: price-tag reports, the lecture's reference points, Chinchilla's
scaling law (fits, IsoFLOP sweeps, the compute-optimal planner). The per-step accounting itself lives below, in
:mod:`lmforge.training.price_tag`, where the Trainer can reach it."""
