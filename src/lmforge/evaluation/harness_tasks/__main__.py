"""``python -m lmforge.evaluation.harness_tasks``: rewrite the tasks' data files from the shipped data sets."""

from lmforge.evaluation.harness_tasks import build

if __name__ == "__main__":
    for file, n in build().items():
        print(f"{file}: {n} rows")
