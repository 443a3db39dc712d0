"""Evaluation by name: public benchmark tasks (GLUE, SuperGLUE, SQuAD, SWAG) and the shipped ones.

    benchmarks.py   the task registry: task type, columns, labels, splits and leaderboard metrics per name
"""
