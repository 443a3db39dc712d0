"""``lmforge predict``: write a fine-tuned model's predictions, with probabilities, for every row of a file.

    $ lmforge predict --model runs/rt/best --data reviews.tsv --output predictions.jsonl
    wrote 1007 predictions to predictions.jsonl

Every output row is the input row (its ``id``, text, gold ``label`` ... in file order) followed by the
model's ``prediction`` and ``prediction_<name>`` columns (``prediction_probabilities``; in ``.tsv``/``.csv``
one ``prediction_prob_<label>`` column per class). ``.jsonl`` output keeps nested values. Labels are not
needed in the input; an input column named ``prediction`` or ``prediction_...`` is refused.
"""

from __future__ import annotations

from lmforge.cli._price_args import add_price_tag_flags
from lmforge.cli.evaluate import add_common, overrides
from lmforge.cli.main import UserError, model_argument, plain_warnings
from lmforge.evaluation import baselines, named
from lmforge.tasks.inference import predict
from lmforge.utils.folder_kinds import MODELS


def run(args) -> int:
    model = model_argument("predict", args.model, (*MODELS, "baseline"))
    with plain_warnings("predict"):
        if named.is_name(args.task):  # a task by name (glue/sst2): --split (default its first evaluation split)
            rows = named.predict(model, args.task, args.output, data=args.data, split=args.split,
                                 data_dir=args.data_dir, overrides=overrides(args), batch_size=args.batch_size,
                                 device=args.device)
            print(f"wrote {len(rows)} predictions to {args.output}")
            return 0
        if args.data is None:
            raise UserError("missing --data FILE (or --task NAME, e.g. glue/sst2, with --data-dir)")
        named.use_data_dir_of(args.data, args.data_dir)
        if baselines.is_baseline(model):
            rows = baselines.predict(model, args.data, args.output)
        else:
            rows = predict(model, args.data, args.output, task=args.task, overrides=overrides(args),
                           subtask=args.subtask, batch_size=args.batch_size, device=args.device)
    print(f"wrote {len(rows)} predictions to {args.output}")
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "predict", help="write a fine-tuned model's predictions (with probabilities) for a data file",
        description="Predict every row of a data file with a task folder written by `lmforge finetune`; labels "
                    "are not needed. Writes each input row, all its columns, followed by its `prediction` (and "
                    "`prediction_...` columns), as JSONL, TSV or CSV by the --output file name.")
    add_common(parser, output=True)
    add_price_tag_flags(parser, "predict")
    parser.set_defaults(func=run)
