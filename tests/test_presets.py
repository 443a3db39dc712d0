"""Full-size presets have exactly the parameter count of the matching Hugging Face model.

Both sides are built on the meta device: shapes only, no memory, no download.
"""

from __future__ import annotations

import pytest
import torch
import transformers as hf

from lmforge.config import ModelConfig, list_presets
from lmforge.models import Transformer


def _hf(name: str):
    bart = dict(vocab_size=50265, max_position_embeddings=1024)
    table = {
        "bert-base": lambda: hf.BertForMaskedLM(hf.BertConfig()),
        "bert-large": lambda: hf.BertForMaskedLM(
            hf.BertConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096)
        ),
        "roberta-base": lambda: hf.RobertaForMaskedLM(
            hf.RobertaConfig(vocab_size=50265, max_position_embeddings=514, type_vocab_size=1, layer_norm_eps=1e-5)
        ),
        "gpt2": lambda: hf.GPT2LMHeadModel(hf.GPT2Config()),
        "gpt2-medium": lambda: hf.GPT2LMHeadModel(hf.GPT2Config(n_embd=1024, n_layer=24, n_head=16)),
        "t5-small": lambda: hf.T5ForConditionalGeneration(hf.T5Config()),
        "t5-base": lambda: hf.T5ForConditionalGeneration(
            hf.T5Config(d_model=768, d_ff=3072, num_layers=12, num_decoder_layers=12, num_heads=12)
        ),
        "bart-base": lambda: hf.BartForConditionalGeneration(
            hf.BartConfig(d_model=768, encoder_layers=6, decoder_layers=6, encoder_attention_heads=12,
                          decoder_attention_heads=12, encoder_ffn_dim=3072, decoder_ffn_dim=3072, **bart)
        ),
        "bart-large": lambda: hf.BartForConditionalGeneration(hf.BartConfig(**bart)),
        "deberta-v3-base": lambda: hf.DebertaV2ForMaskedLM(hf.DebertaV2Config(
            vocab_size=128100, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
            relative_attention=True, position_biased_input=False, pos_att_type="p2c|c2p", position_buckets=256,
            max_relative_positions=-1, share_att_key=True, norm_rel_ebd="layer_norm")),
        "switch-base-8": lambda: hf.SwitchTransformersForConditionalGeneration(hf.SwitchTransformersConfig(
            d_model=768, d_ff=3072, num_layers=12, num_decoder_layers=12, num_heads=12, num_experts=8,
            num_sparse_encoder_layers=6, num_sparse_decoder_layers=6, expert_capacity=64)),
        "mixtral-8x7b": lambda: hf.MixtralForCausalLM(hf.MixtralConfig(max_position_embeddings=32768)),
        "llama-1b": lambda: hf.LlamaForCausalLM(
            hf.LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                           num_attention_heads=32, num_key_value_heads=4, max_position_embeddings=2048)
        ),
    }
    with torch.device("meta"):
        return table[name]()


FULL_SIZE = ["bert-base", "bert-large", "roberta-base", "gpt2", "gpt2-medium", "t5-small", "t5-base",
             "bart-base", "bart-large", "llama-1b", "deberta-v3-base", "switch-base-8", "mixtral-8x7b"]


@pytest.mark.parametrize("name", FULL_SIZE)
def test_parameter_count_equals_hugging_face(name):
    with torch.device("meta"):
        ours = Transformer(ModelConfig.from_preset(name))
    theirs = _hf(name)
    assert ours.num_parameters() == theirs.num_parameters()


def test_known_counts():
    # Published figures, as a sanity check of the comparison itself.
    with torch.device("meta"):
        assert Transformer(ModelConfig.from_preset("gpt2")).num_parameters() == 124_439_808
        assert Transformer(ModelConfig.from_preset("t5-small")).num_parameters() == 60_506_624
        mixtral = Transformer(ModelConfig.from_preset("mixtral-8x7b"))
        # 46.7B in total, 12.9B active per token (two of eight experts), as Mistral AI reports
        assert (mixtral.num_parameters(), mixtral.active_parameters()) == (46_702_792_704, 12_879_925_248)


@pytest.mark.parametrize("name", [n for n in list_presets() if n.endswith("-tiny")])
def test_tiny_presets_are_cpu_sized(name):
    with torch.device("meta"):
        n = Transformer(ModelConfig.from_preset(name)).num_parameters()
    assert 5e6 <= n <= 15e6, f"{name} has {n:,} parameters"


def test_every_preset_round_trips_and_validates():
    for name in list_presets():
        cfg = ModelConfig.from_preset(name)
        assert ModelConfig.from_dict(cfg.to_dict()) == cfg
