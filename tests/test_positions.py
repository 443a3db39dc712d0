"""Positional encodings against their defining formulas."""

from __future__ import annotations

import math

import torch

from lmforge.nn.positions import RotaryEmbedding, ShawRelativePositions, T5RelativeBias, apply_rotary, sinusoidal_table
from lmforge.nn.positions.alibi import alibi_slopes


def test_sinusoidal_matches_the_lecture_formula():
    # p_i = [sin(i / 10000^(2j/d)), cos(i / 10000^(2j/d))]_j, interleaved (Vaswani et al. 2017).
    d, table = 16, sinusoidal_table(50, 16)
    for i in (0, 1, 7, 49):
        for j in range(d // 2):
            angle = i / 10000 ** (2 * j / d)
            assert math.isclose(table[i, 2 * j].item(), math.sin(angle), abs_tol=1e-6)
            assert math.isclose(table[i, 2 * j + 1].item(), math.cos(angle), abs_tol=1e-6)


def test_rope_scores_depend_only_on_relative_offset():
    rope = RotaryEmbedding(head_dim=32, base=10000.0)
    q, k = torch.randn(32, dtype=torch.float64), torch.randn(32, dtype=torch.float64)
    positions = torch.arange(64)[None]
    cos, sin = (t.double() for t in rope(positions))

    def at(x, p):
        return apply_rotary(x.view(1, 1, 1, 32).expand(1, 1, 64, 32), cos, sin)[0, 0, p]

    for delta in (0, 3, 17):
        scores = [at(q, m) @ at(k, m - delta) for m in range(delta, 64, 7)]
        assert max(scores) - min(scores) < 1e-5, f"offset {delta}: scores vary with absolute position"
    assert abs(at(q, 10) @ at(k, 7) - at(q, 10) @ at(k, 2)) > 1e-6


def test_partial_rotary_leaves_the_tail_untouched():
    rope = RotaryEmbedding(head_dim=16, rotary_dim=8)
    x = torch.randn(1, 2, 5, 16)
    y = apply_rotary(x, *rope(torch.arange(5)[None]))
    torch.testing.assert_close(y[..., 8:], x[..., 8:])
    assert not torch.allclose(y[..., 1:, :8], x[..., 1:, :8])


def test_shaw_distances_beyond_k_share_the_clipped_embedding():
    rel = ShawRelativePositions(head_dim=4, k=2, values=True)
    idx = rel.indices(torch.arange(8), torch.arange(8))
    assert idx[0, 2].item() == idx[0, 7].item() == 4  # +2 and +7 both clip to +k
    assert idx[7, 0].item() == idx[7, 5].item() == 0  # -7 and -2 both clip to -k
    q = torch.randn(1, 1, 8, 4)
    bias = rel.key_bias(q, idx, scale=1.0)
    assert torch.allclose(bias[0, 0, 0, 2], bias[0, 0, 0, 7]) and torch.allclose(bias[0, 0, 7, 0], bias[0, 0, 7, 5])
    torch.testing.assert_close(bias[0, 0, 3, 4], q[0, 0, 3] @ rel.key_table[3])


def test_t5_buckets_bidirectional_and_causal():
    enc = T5RelativeBias(n_heads=2, bidirectional=True, num_buckets=32, max_distance=128)
    from lmforge.nn.positions.t5_bias import relative_position_bucket

    rel = torch.tensor([-200, -10, -1, 0, 1, 10, 200])
    # Hand-checked: 16 buckets per direction, exact below 8, log-spaced 8..15 up to distance 128.
    assert relative_position_bucket(rel, True, 32, 128).tolist() == [15, 8, 1, 0, 17, 24, 31]
    assert relative_position_bucket(rel, False, 32, 128).tolist() == [31, 10, 1, 0, 0, 0, 0]
    # And against the reference implementation over a wide range.
    from transformers.models.t5.modeling_t5 import T5Attention

    wide = torch.arange(-300, 301)
    for bidirectional in (True, False):
        ref = T5Attention._relative_position_bucket(wide, bidirectional=bidirectional, num_buckets=32, max_distance=128)
        assert torch.equal(relative_position_bucket(wide, bidirectional, 32, 128), ref)
    assert enc(torch.arange(4), torch.arange(6)).shape == (1, 2, 4, 6)


def test_alibi_slopes_are_the_papers():
    assert torch.allclose(alibi_slopes(8), torch.tensor([2.0 ** -(i + 1) for i in range(8)]))
    assert len(alibi_slopes(6)) == 6
