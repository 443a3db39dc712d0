"""Continuous batching for the server: the per-request job (:mod:`.job`) and the scheduler thread that runs
every job's decode steps together (:mod:`.scheduler`) over :class:`lmforge.generation.slots.SlotBatch`."""
