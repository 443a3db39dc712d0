"""Evaluation by name: public benchmark tasks (GLUE, SuperGLUE, SQuAD, SWAG, SNLI, RACE ...) and the shipped ones.

    benchmarks.py   the task registry: task type, columns, labels, splits and leaderboard metrics per name
    benchmark_suite.py  `lmforge benchmark glue`: every task fine-tuned and scored, the table and its average,
                    test predictions in the leaderboard's submission format
    fill_mask.py    the top-k fillers of a [MASK]: encoders, decoders (next token), T5 (sentinel), BART
    cloze_probe.py  LAMA-style knowledge probes: P@1 / P@10 by relation, on facts stated in the shipped corpora
    length_extrapolation.py  a decoder's LM loss per bucket of positions, read past its training length
    forgetting.py   catastrophic forgetting: the pre-training loss of a body before and after fine-tuning
    harness.py      `lmforge evaluate --harness`: lm-evaluation-harness tasks on a folder, offline
    harness_lm.py   the lm_eval model class (``lmforge``): loglikelihood, rolling loglikelihood, generate_until
    harness_tasks/  lmforge's own lm_eval tasks (YAML + JSON lines from the shipped data sets)
    baselines.py    simple baselines as task folders, trained and scored: classify's four below, and (through
                    task_baselines.py) one or two for every other task type
    baseline_common.py    what they share: --baseline-option settings, a text (+ pair) as one text, checkpoints
    linear_baselines.py   TF-IDF + logistic regression, n-gram SVM (scikit-learn pipelines, stored as tensors)
    bilstm_classifier.py  BiLSTM with max pooling over time
    cnn_classifier.py     Kim's (2014) CNN: filters of widths 3-5, max-over-time pooling
    word_vocab.py   the neural baselines' word vocabulary, and their random or word2vec starting vectors
    task_baselines.py     the baselines of tag, regress, qa, multiple-choice, seq2seq: read, train, save, score
    crf_tagger.py   a linear-chain CRF on word features (sklearn-crfsuite)
    bilstm_tagger.py      a BiLSTM tagger (the BiLSTM classifier's layers, a linear layer per word)
    ridge_baseline.py     TF-IDF + ridge regression (scikit-learn, stored as tensors)
    qa_window.py    the sliding-window lexical-overlap answer span
    mc_similarity.py      the choice most TF-IDF-similar to the context
    lead_n.py       Lead-3: the source's first sentences
    summarization.py      ROUGE-1/2/L/Lsum as CNN/DailyMail and XSum papers report it (Lsum: a sentence a line)
    sts_benchmark.py      Sentence-BERT's STS row (STS12-16, STS-B, SICK-R): Spearman of cosines, no training
"""
