"""Representations: sentence embeddings, Sentence-BERT training, retrieval, probing, contextual neighbours.

    module      what                                                         CLI
    pooling     pool(h, mask, cls|mean|max|last)                             -
    (nn)        ScalarMix: ELMo's learned mix of layers (lmforge.nn.scalar_mix) -
    encoder     SentenceEncoder(model, tok).encode / .word_vectors           lmforge embed
    losses      triplet, multiple-negatives ranking, cosine regression       -
    sbert       train_embedding, finetune_embedding, evaluate_sts/retrieval  lmforge finetune --task embedding
    index       VectorIndex (exact cosine top-k, optional FAISS HNSW)        lmforge index build|search
    probe       probe_layers: a logistic-regression probe per layer         lmforge probe
    neighbors   contextual vs static (word2vec / PPMI-SVD) neighbours        lmforge neighbors
    static      AveragedEmbeddings: mean of word2vec / embedding-table rows  -

ELMo's biLM itself is a model: :mod:`lmforge.models.bilstm_lm`.

Example (``all-MiniLM-L6-v2``: the pretrained model that ``make`` installs; any model folder works):
    >>> from lmforge.embeddings import SentenceEncoder
    >>> enc = SentenceEncoder.load("all-MiniLM-L6-v2")
    >>> enc.encode(["A man plays guitar.", "Someone plays music."]).shape
    (2, 384)
"""

from lmforge.embeddings.encoder import SentenceEncoder, default_pooling, embed_texts
from lmforge.embeddings.losses import cosine_similarity_loss, multiple_negatives_ranking_loss, triplet_loss
from lmforge.embeddings.pooling import POOLINGS, pool
from lmforge.nn.scalar_mix import ScalarMix

Encoder = SentenceEncoder  # the short name, kept as a public alias

__all__ = ["Encoder", "POOLINGS", "ScalarMix", "SentenceEncoder", "cosine_similarity_loss", "default_pooling",
           "embed_texts", "multiple_negatives_ranking_loss", "pool", "triplet_loss"]
