"""Evaluation by name: public benchmark tasks (GLUE, SuperGLUE, SQuAD, SWAG) and the shipped ones.

    benchmarks.py   the task registry: task type, columns, labels, splits and leaderboard metrics per name
    fill_mask.py    the top-k fillers of a [MASK]: encoders, decoders (next token), T5 (sentinel), BART
"""
