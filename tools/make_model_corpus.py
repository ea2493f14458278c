"""Writes tests/fixtures/models/: real architectures, ONNX Runtime Training's
artifacts of them, and what ONNX Runtime and float64 PyTorch compute on them.

Two stages, each in its own environment (neither is a jaxort dependency, and
this script never imports jaxort):

    # 1. torch 2.13.0 CPU, torchvision, transformers, onnx 1.16.2
    python tools/make_model_corpus.py export [output_dir [case,case,...]]
    # 2. onnxruntime-training 1.19.2, onnx 1.16.2, numpy < 2.3
    python tools/make_model_corpus.py ort [output_dir [case,case,...]]

Stage 2 reads a float64 trajectory file stage 1 leaves in each folder and
deletes it, so run both, in this order. Naming cases runs only those; the
other folders, and their rows of the corpus README, are left as they are.

Stage 1 builds each model with random initialisation from a tiny config
(torchvision constructors with ``weights=None``, transformers models from a
config object, plain torch recurrent classifiers; nothing is downloaded),
exports it with the legacy exporter in training mode, opset 17, no constant
folding, and records:

- ``model.onnx``: the forward model given to ``generate_artifacts``;
- ``batches.npz``: five fixed training batches (the eval step reuses the first);
- ``torch_reference.npz``: float64 PyTorch gradients of the loss at the
  initial parameters on batch 0, and the float64 and float32 PyTorch
  trajectories of the same five AdamW steps ORT takes (losses, trainable
  parameters after);
- ``case.json``: input and label names, loss, learning rate, requires_grad
  and frozen parameter names.

Stage 2 runs ``onnxruntime.training.artifacts.generate_artifacts`` on
``model.onnx`` (requires_grad = every float parameter, frozen = the float
buffers, AdamW), trains the artifacts for five steps with
``onnxruntime.training.api`` and records ``expected.npz`` (losses,
parameters after) and ``expected.json`` (losses, train steps/s over steps
3-5, the non-standard ops on the loss path, whether the run is
ill-conditioned) and the folder's README.md. Where ORT cannot make or train
its artifacts of a model, the folder keeps no ORT file: ``expected.json``
records ORT's error (``ort_error``) and the ops on the loss path of
``model.onnx``, and PyTorch's float32 and float64 runs are the reference.

Workarounds for ONNX Runtime 1.19.2 (see docs/real-models.md):

- HardSwish and HardSigmoid have no ORT gradient builder: in MobileNetV3 the
  torch modules are replaced before export by the same functions written with
  Relu (``relu6(x + 3) = relu(x + 3) - relu(x - 3)``). LeViT keeps its
  HardSwish, so ORT has no reference for it.
- ResizeGrad has no ORT CPU kernel: the UNet's nearest upsampling stays a
  Resize, so ORT has no reference for it.
- InstanceNormalization has no ORT gradient builder: Wav2Vec2's GroupNorm
  exports as one, so ORT has no reference for it.
- ORT's LayerNormalization gradient needs the optional Mean and InvStdDev
  outputs, which torch does not export: stage 1 adds them to every
  LayerNormalization node.
- ORT's Module cannot load the eval model it writes for a training-mode
  BatchNormalization with three outputs: stage 2 trains without an eval
  model in that case; the eval model is committed as ORT wrote it.
- ScaledSumFusion wires the wrong input into ScaledSum when the third addend
  of ``x + (u / c + v / c)`` is not itself a Div by a constant (DeBERTa's
  ``bmm(q, k^T / scale)``): stage 1 moves such a Div after its MatMul.
- ScaledSum has CUDA and ROCm kernels only: stage 2 trains a copy of the
  training model with each ScaledSum written as Mul and Add; the committed
  training model keeps ORT's ScaledSum.

Every random value comes from a fixed seed, so a rerun gives the same files.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "tests" / "fixtures" / "models"
STEPS = 5
LR = 1e-3
# onnxruntime.training.artifacts' AdamW: HuggingFace mode (adam_mode=1), bias correction on.
BETA1, BETA2, EPS, WEIGHT_DECAY = 0.9, 0.999, 1e-6, 0.0
# A float32 run is ill-conditioned when float32 and float64 PyTorch disagree by more than this.
PARAM_ATOL = 1e-4
TRAJECTORY = "torch_float64_trajectory.npz"


# stage 1: export (torch, torchvision, transformers) ------------------------------------------


def _import_torchvision():
    """Imports torchvision whose wheel's C++ ops do not match the CPU torch build.

    The PyPI torchvision wheel may be a CUDA build whose ``_C`` extension does
    not load beside torch's CPU build; importing it then fails while it
    registers fake kernels for ``torchvision::nms`` and friends. The models are
    pure Python, so those registrations are skipped.
    """
    import torch
    import torch.library

    original = torch.library.register_fake

    def register_fake(op, *args, **kwargs):
        if isinstance(op, str) and op.startswith("torchvision::"):
            return lambda fn=None, *a, **k: fn
        return original(op, *args, **kwargs)

    torch.library.register_fake = register_fake
    try:
        import torchvision  # noqa: F401
    finally:
        torch.library.register_fake = original


def _relu_hard_activations(module):
    """Replaces nn.Hardswish and nn.Hardsigmoid by the same functions written with Relu."""
    import torch
    from torch import nn

    class ReluHardsigmoid(nn.Module):
        def forward(self, x):
            return (torch.relu(x + 3.0) - torch.relu(x - 3.0)) / 6.0

    class ReluHardswish(nn.Module):
        def forward(self, x):
            return x * ((torch.relu(x + 3.0) - torch.relu(x - 3.0)) / 6.0)

    for name, child in module.named_children():
        if isinstance(child, nn.Hardswish):
            setattr(module, name, ReluHardswish())
        elif isinstance(child, nn.Hardsigmoid):
            setattr(module, name, ReluHardsigmoid())
        else:
            _relu_hard_activations(child)
    return module


def _resnet18(width):
    """torchvision's ResNet-18 (BasicBlock, [2, 2, 2, 2]) with stage widths w, 2w, 4w, 8w."""
    from torch import nn
    from torchvision.models.resnet import BasicBlock, ResNet

    class NarrowResNet(ResNet):
        def __init__(self, num_classes):
            nn.Module.__init__(self)
            self._norm_layer = nn.BatchNorm2d
            self.inplanes, self.dilation, self.groups, self.base_width = width, 1, 1, 64
            self.conv1 = nn.Conv2d(3, width, kernel_size=7, stride=2, padding=3, bias=False)
            self.bn1 = nn.BatchNorm2d(width)
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
            self.layer1 = self._make_layer(BasicBlock, width, 2)
            self.layer2 = self._make_layer(BasicBlock, 2 * width, 2, stride=2)
            self.layer3 = self._make_layer(BasicBlock, 4 * width, 2, stride=2)
            self.layer4 = self._make_layer(BasicBlock, 8 * width, 2, stride=2)
            self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
            self.fc = nn.Linear(8 * width, num_classes)

    return NarrowResNet(10)


def _mlp_mixer():
    """MLP-Mixer: a 4x4 patch embedding, two mixer blocks (token and channel MLPs), mean pool, head."""
    from torch import nn

    class MixerBlock(nn.Module):
        def __init__(self, tokens, dim):
            super().__init__()
            self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.tokens = nn.Sequential(nn.Linear(tokens, 2 * tokens), nn.GELU(), nn.Linear(2 * tokens, tokens))
            self.channels = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

        def forward(self, x):
            x = x + self.tokens(self.norm1(x).transpose(1, 2)).transpose(1, 2)
            return x + self.channels(self.norm2(x))

    class Mixer(nn.Module):
        def __init__(self, dim=16, patch=4, tokens=16, classes=10):
            super().__init__()
            self.stem = nn.Conv2d(3, dim, kernel_size=patch, stride=patch)
            self.blocks = nn.Sequential(MixerBlock(tokens, dim), MixerBlock(tokens, dim))
            self.norm = nn.LayerNorm(dim)
            self.head = nn.Linear(dim, classes)

        def forward(self, x):
            x = self.stem(x).flatten(2).transpose(1, 2)
            return self.head(self.norm(self.blocks(x)).mean(dim=1))

    return Mixer()


def _unet():
    """A two-level UNet: MaxPool down, ConvTranspose and nearest Resize up, skip Concats, per-pixel head."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    def block(cin, cout):
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())

    class UNet(nn.Module):
        def __init__(self, classes=4):
            super().__init__()
            self.enc1, self.enc2, self.mid = block(3, 8), block(8, 16), block(16, 16)
            self.up2 = nn.ConvTranspose2d(16, 16, kernel_size=2, stride=2)
            self.dec2, self.dec1 = block(32, 8), block(16, 8)
            self.head = nn.Conv2d(8, classes, 1)

        def forward(self, x):
            e1 = self.enc1(x)                                   # 8 x 16 x 16
            e2 = self.enc2(F.max_pool2d(e1, 2))                 # 16 x 8 x 8
            m = self.mid(F.max_pool2d(e2, 2))                   # 16 x 4 x 4
            d2 = self.dec2(torch.cat([self.up2(m), e2], 1))     # 8 x 8 x 8
            up = F.interpolate(d2, scale_factor=2.0, mode="nearest")
            d1 = self.dec1(torch.cat([up, e1], 1))              # 8 x 16 x 16
            return self.head(d1).permute(0, 2, 3, 1).reshape(-1, self.head.out_channels)

    return UNet()


def _classifier(model_fn):
    import torch

    class Logits(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, *args):
            return model_fn(self.model, *args)

    return Logits


def _build(name):
    """(torch module, example inputs, input names, labels, loss kind, batch maker)."""
    import torch

    g = torch.Generator().manual_seed(1234)
    gauss = torch.randn

    def randn(*shape, generator):
        # Multiples of 1/4 in [-3, 3]: exact in float32 and under a byte each once compressed.
        return (gauss(*shape, generator=generator) * 4).round().clamp(-12, 12) / 4

    torch_randn = randn
    if name == "resnet18":
        model, batch = _resnet18(3), 8
        x = lambda: torch_randn(batch, 3, 32, 32, generator=g)
        return model, ["input"], x, lambda: torch.randint(0, 10, (batch,), generator=g), "CrossEntropyLoss"
    if name == "mobilenet_v3_small":
        from torchvision.models import mobilenet_v3_small

        model = _relu_hard_activations(
            mobilenet_v3_small(weights=None, width_mult=0.125, reduced_tail=True, dropout=0.0, num_classes=10))
        x = lambda: torch_randn(8, 3, 32, 32, generator=g)
        return model, ["input"], x, lambda: torch.randint(0, 10, (8,), generator=g), "CrossEntropyLoss"
    if name == "efficientnet_b0":
        from torchvision.models.efficientnet import EfficientNet, _efficientnet_conf

        # The first six of B0's seven MBConv stages (the seventh alone would triple the size).
        setting, _ = _efficientnet_conf("efficientnet_b0", width_mult=0.1, depth_mult=0.25)
        model = EfficientNet(setting[:6], dropout=0.0, stochastic_depth_prob=0.0, num_classes=10, last_channel=64)
        x = lambda: torch_randn(8, 3, 32, 32, generator=g)
        return model, ["input"], x, lambda: torch.randint(0, 10, (8,), generator=g), "CrossEntropyLoss"
    text = dict(batch=4, seq=8, vocab=64)
    ids = lambda: torch.randint(0, text["vocab"], (text["batch"], text["seq"]), generator=g)
    if name == "bert":
        from transformers import BertConfig, BertForSequenceClassification

        cfg = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=16, type_vocab_size=2,
                         hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=4,
                         attn_implementation="eager")
        wrap = _classifier(lambda m, i: m(input_ids=i, return_dict=False)[0])
        return wrap(BertForSequenceClassification(cfg)), ["input_ids"], ids, \
            lambda: torch.randint(0, 4, (4,), generator=g), "CrossEntropyLoss"
    if name == "distilbert":
        from transformers import DistilBertConfig, DistilBertForSequenceClassification

        cfg = DistilBertConfig(vocab_size=64, dim=32, n_layers=2, n_heads=2, hidden_dim=64,
                               max_position_embeddings=16, dropout=0.0, attention_dropout=0.0,
                               seq_classif_dropout=0.0, num_labels=4, attn_implementation="eager")
        wrap = _classifier(lambda m, i: m(input_ids=i, return_dict=False)[0])
        return wrap(DistilBertForSequenceClassification(cfg)), ["input_ids"], ids, \
            lambda: torch.randint(0, 4, (4,), generator=g), "CrossEntropyLoss"
    if name == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        cfg = GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2, n_inner=64,
                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
                         attn_implementation="eager")
        wrap = _classifier(lambda m, i: m(input_ids=i, return_dict=False)[0].reshape(-1, 64))
        return wrap(GPT2LMHeadModel(cfg)), ["input_ids"], ids, \
            lambda: torch.randint(0, 64, (32,), generator=g), "CrossEntropyLoss"
    if name == "t5":
        from transformers import T5Config, T5ForConditionalGeneration

        cfg = T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=32, num_layers=2, num_decoder_layers=2,
                       num_heads=2, relative_attention_num_buckets=8, relative_attention_max_distance=16,
                       dropout_rate=0.0, decoder_start_token_id=0, attn_implementation="eager")
        wrap = _classifier(lambda m, i, d: m(input_ids=i, decoder_input_ids=d, return_dict=False)[0]
                           .reshape(-1, 64))
        return wrap(T5ForConditionalGeneration(cfg)), ["input_ids", "decoder_input_ids"], \
            lambda: (ids(), ids()), lambda: torch.randint(0, 64, (32,), generator=g), "CrossEntropyLoss"
    if name == "vit":
        from transformers import ViTConfig, ViTForImageClassification

        cfg = ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0, num_labels=10, attn_implementation="eager")
        wrap = _classifier(lambda m, x: m(pixel_values=x, return_dict=False)[0])
        return wrap(ViTForImageClassification(cfg)), ["pixel_values"], \
            lambda: torch_randn(4, 3, 16, 16, generator=g), lambda: torch.randint(0, 10, (4,), generator=g), \
            "CrossEntropyLoss"
    if name == "swin":
        from transformers import SwinConfig, SwinForImageClassification

        # One stage of two blocks: windowed attention, then shifted windows (torch.roll, an attention mask).
        cfg = SwinConfig(image_size=16, patch_size=2, num_channels=3, embed_dim=8, depths=[2],
                         num_heads=[2], window_size=2, mlp_ratio=2.0, hidden_dropout_prob=0.0,
                         attention_probs_dropout_prob=0.0, drop_path_rate=0.0, num_labels=10,
                         attn_implementation="eager")
        wrap = _classifier(lambda m, x: m(pixel_values=x, return_dict=False)[0])
        return wrap(SwinForImageClassification(cfg)), ["pixel_values"], \
            lambda: torch_randn(4, 3, 16, 16, generator=g), lambda: torch.randint(0, 10, (4,), generator=g), \
            "CrossEntropyLoss"
    if name == "mlp_mixer":
        return _mlp_mixer(), ["input"], lambda: torch_randn(4, 3, 16, 16, generator=g), \
            lambda: torch.randint(0, 10, (4,), generator=g), "CrossEntropyLoss"
    if name == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
                          attention_dropout=0.0, bos_token_id=0, eos_token_id=0, pad_token_id=None,
                          use_cache=False, attn_implementation="eager")
        # An all-ones attention mask: without one, transformers looks for packed sequences in the
        # position ids with torch.diff, which the exporter cannot write.
        wrap = _classifier(lambda m, i: m(input_ids=i, attention_mask=torch.ones_like(i), use_cache=False,
                                          return_dict=False)[0].reshape(-1, 64))
        return wrap(LlamaForCausalLM(cfg)), ["input_ids"], ids, \
            lambda: torch.randint(0, 64, (32,), generator=g), "CrossEntropyLoss"
    if name == "unet":
        # Per-pixel logits flattened to [batch * 16 * 16, 4], one label a pixel.
        return _unet(), ["input"], lambda: torch_randn(8, 3, 16, 16, generator=g), \
            lambda: torch.randint(0, 4, (8 * 16 * 16,), generator=g), "CrossEntropyLoss"
    if name == "densenet":
        from torchvision.models import DenseNet

        model = DenseNet(growth_rate=4, block_config=(2, 2), num_init_features=8, bn_size=2, drop_rate=0.0,
                         num_classes=10)
        return model, ["input"], lambda: torch_randn(8, 3, 32, 32, generator=g), \
            lambda: torch.randint(0, 10, (8,), generator=g), "CrossEntropyLoss"
    if name == "levit":
        from transformers import LevitConfig, LevitForImageClassification

        # HardSwish stays HardSwish here: ORT 1.19.2 has no gradient builder for it (no ORT reference).
        cfg = LevitConfig(image_size=32, num_channels=3, patch_size=16, hidden_sizes=[16, 32],
                          num_attention_heads=[1, 2], depths=[1, 1], key_dim=[8, 8], mlp_ratio=[2, 2],
                          attention_ratio=[2, 2], drop_path_rate=0, num_labels=10)
        cfg.down_ops = cfg.down_ops[:1]  # the config writes one subsampling between each of three stages
        wrap = _classifier(lambda m, x: m(pixel_values=x, return_dict=False)[0])
        return wrap(LevitForImageClassification(cfg)), ["pixel_values"], \
            lambda: torch_randn(8, 3, 32, 32, generator=g), lambda: torch.randint(0, 10, (8,), generator=g), \
            "CrossEntropyLoss"
    if name == "wav2vec2":
        from transformers import Wav2Vec2Config, Wav2Vec2ForSequenceClassification

        # feat_extract_norm="group": GroupNorm on the first conv of the feature extractor; the
        # positional conv is weight-normed. SpecAugment masking is off (it is random in training).
        cfg = Wav2Vec2Config(vocab_size=8, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                             intermediate_size=32, conv_dim=(8, 8), conv_stride=(5, 2), conv_kernel=(10, 3),
                             feat_extract_norm="group", num_conv_pos_embeddings=4, num_conv_pos_embedding_groups=2,
                             hidden_dropout=0.0, activation_dropout=0.0, attention_dropout=0.0,
                             feat_proj_dropout=0.0, final_dropout=0.0, layerdrop=0.0, mask_time_prob=0.0,
                             mask_feature_prob=0.0, classifier_proj_size=8, num_labels=4,
                             attn_implementation="eager")
        wrap = _classifier(lambda m, x: m(input_values=x, return_dict=False)[0])
        return wrap(Wav2Vec2ForSequenceClassification(cfg)), ["input_values"], \
            lambda: torch_randn(4, 400, generator=g), lambda: torch.randint(0, 4, (4,), generator=g), \
            "CrossEntropyLoss"
    if name == "deberta":
        from transformers import DebertaV2Config, DebertaV2ForSequenceClassification

        # DeBERTa-v3's layout: disentangled attention (content-to-position and position-to-content)
        # over log-bucketed relative positions (4 buckets, so seq 8 reaches the log buckets), one
        # relative embedding shared by the layers and layer-normed, no absolute position embedding.
        cfg = DebertaV2Config(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                              intermediate_size=64, max_position_embeddings=16, type_vocab_size=0,
                              relative_attention=True, pos_att_type=["p2c", "c2p"], position_buckets=4,
                              max_relative_positions=-1, share_att_key=True, norm_rel_ebd="layer_norm",
                              position_biased_input=False, hidden_dropout_prob=0.0,
                              attention_probs_dropout_prob=0.0, pooler_dropout=0.0, cls_dropout=0.0,
                              num_labels=3, attn_implementation="eager")
        wrap = _classifier(lambda m, i: m(input_ids=i, return_dict=False)[0])
        return wrap(DebertaV2ForSequenceClassification(cfg)), ["input_ids"], ids, \
            lambda: torch.randint(0, 3, (4,), generator=g), "CrossEntropyLoss"
    if name == "bart":
        from transformers import BartConfig, BartForSequenceClassification

        # Encoder-decoder; the classification head pools the decoder's hidden state at the `</s>`
        # tokens with a boolean mask (Equal -> NonZero -> GatherND in the export: a shape that
        # depends on the input's values). BART requires the same number of `</s>` in every row:
        # ids are drawn from [3, 64) (no bos, pad or eos) and each row ends with one eos.
        cfg = BartConfig(vocab_size=64, d_model=32, encoder_layers=1, decoder_layers=1,
                         encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
                         decoder_ffn_dim=64, max_position_embeddings=16, dropout=0.0, attention_dropout=0.0,
                         activation_dropout=0.0, classifier_dropout=0.0, num_labels=3, pad_token_id=1,
                         bos_token_id=0, eos_token_id=2, use_cache=False, attn_implementation="eager")

        def eos_ids():
            x = torch.randint(3, text["vocab"], (text["batch"], text["seq"]), generator=g)
            x[:, -1] = cfg.eos_token_id
            return x

        wrap = _classifier(lambda m, i: m(input_ids=i, return_dict=False)[0])
        return wrap(BartForSequenceClassification(cfg)), ["input_ids"], eos_ids, \
            lambda: torch.randint(0, 3, (4,), generator=g), "CrossEntropyLoss"
    if name in ("lstm", "gru"):
        from torch import nn

        class Recurrent(nn.Module):
            def __init__(self):
                super().__init__()
                cell = nn.LSTM if name == "lstm" else nn.GRU
                self.rnn = cell(input_size=8, hidden_size=16, batch_first=True)
                self.head = nn.Linear(16, 4 if name == "lstm" else 2)

            def forward(self, x):
                out, _ = self.rnn(x)
                return self.head(out[:, -1])

        x = lambda: torch_randn(4, 6, 8, generator=g)
        if name == "lstm":
            return Recurrent(), ["input"], x, lambda: torch.randint(0, 4, (4,), generator=g), "CrossEntropyLoss"
        return Recurrent(), ["input"], x, lambda: torch_randn(4, 2, generator=g), "MSELoss"
    raise KeyError(name)


CASES = ("resnet18", "mobilenet_v3_small", "efficientnet_b0", "bert", "distilbert", "gpt2", "t5", "vit",
         "lstm", "gru", "swin", "mlp_mixer", "llama", "unet", "densenet", "levit",
         "wav2vec2", "deberta", "bart")
DESCRIPTIONS = {
    "resnet18": "torchvision ResNet-18 (BasicBlock [2,2,2,2]), stage widths 3-6-12-24, 3x32x32, batch 8",
    "mobilenet_v3_small": "torchvision mobilenet_v3_small(width_mult=0.125, reduced_tail=True), 3x32x32, batch 8",
    "efficientnet_b0": "torchvision EfficientNet-B0 config (width 0.1, depth 0.25, stages 1-6), 3x32x32, batch 8",
    "bert": "transformers BertForSequenceClassification, 2 layers, hidden 32, seq 8, vocab 64, batch 4",
    "distilbert": "transformers DistilBertForSequenceClassification, 2 layers, dim 32, seq 8, vocab 64, batch 4",
    "gpt2": "transformers GPT2LMHeadModel, 2 layers, n_embd 32, seq 8, vocab 64, batch 4, next-token logits",
    "t5": "transformers T5ForConditionalGeneration, 2+2 layers, d_model 32, d_ff 32, seq 8, vocab 64, batch 4",
    "vit": "transformers ViTForImageClassification, 2 layers, hidden 32, 3x16x16, patch 4, batch 4",
    "lstm": "torch nn.LSTM(8 -> 16) + Linear(16 -> 4) on the last step, seq 6, batch 4",
    "gru": "torch nn.GRU(8 -> 16) + Linear(16 -> 2) on the last step, seq 6, batch 4, MSE regression",
    "swin": "transformers SwinForImageClassification, embed_dim 8, depths [2] (windows, shifted windows), "
            "2 heads, window 2, 3x16x16, patch 2, batch 4",
    "mlp_mixer": "torch MLP-Mixer, 4x4 patches, dim 16, 2 mixer blocks (token MLP 16-32, channel MLP 16-32, "
                 "GELU), 3x16x16, batch 4",
    "llama": "transformers LlamaForCausalLM, 2 layers, hidden 32, 4 heads, 2 KV heads, intermediate 64, "
             "seq 8, vocab 64, batch 4, next-token logits",
    "unet": "torch UNet, widths 8-16-16, MaxPool down, ConvTranspose and nearest Resize up, skip Concats, "
            "per-pixel 4 classes, 3x16x16, batch 8",
    "densenet": "torchvision DenseNet(growth_rate=4, block_config=(2,2), num_init_features=8, bn_size=2), "
                "3x32x32, batch 8",
    "levit": "transformers LevitForImageClassification, hidden [16,32], heads [1,2], depths [1,1], key_dim 8, "
             "3x32x32, batch 8, HardSwish kept",
    "wav2vec2": "transformers Wav2Vec2ForSequenceClassification, conv features 8-8 (GroupNorm), weight-normed "
                "positional conv, 1 layer, hidden 16, 400 samples, batch 4",
    "deberta": "transformers DebertaV2ForSequenceClassification, 2 layers, hidden 32, 2 heads, intermediate 64, "
               "relative attention (p2c, c2p, 4 position buckets), seq 8, vocab 64, 3 labels, batch 4",
    "bart": "transformers BartForSequenceClassification, 1+1 layers, d_model 32, 2 heads, ffn 64, seq 8, "
            "vocab 64, eos-token pooling (NonZero, GatherND), 3 labels, batch 4",
}


def _loss(kind, logits, labels):
    import torch.nn.functional as F

    return F.cross_entropy(logits, labels) if kind == "CrossEntropyLoss" else F.mse_loss(logits, labels)


def _adamw_hf(params, grads, m, v, step):
    """One step of ORT's AdamWOptimizer (adam_mode=1, correct_bias=1), in place on torch tensors."""
    import torch

    with torch.no_grad():
        for p, g, mi, vi in zip(params, grads, m, v):
            mi.mul_(BETA1).add_(g, alpha=1 - BETA1)
            vi.mul_(BETA2).addcmul_(g, g, value=1 - BETA2)
            step_size = LR * np.sqrt(1 - BETA2 ** step) / (1 - BETA1 ** step)
            p.sub_(step_size * mi / (vi.sqrt() + EPS))
            if WEIGHT_DECAY:
                p.sub_(LR * WEIGHT_DECAY * p)


def _trajectory(model, trainable, inputs, labels, kind, dtype):
    """Losses of five ORT-style AdamW steps and the trainable parameters after, in ``dtype``."""
    import copy

    import torch

    model = copy.deepcopy(model).to(dtype).train()
    named = dict(model.named_parameters())
    params = [named[n] for n in trainable]
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    losses, first_grads = [], None
    for step in range(STEPS):
        args = [t[step].to(dtype) if t.is_floating_point() else t[step] for t in inputs]
        y = labels[step].to(dtype) if labels.is_floating_point() else labels[step]
        loss = _loss(kind, model(*args), y)
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        grads = [torch.zeros_like(p) if gr is None else gr for p, gr in zip(params, grads)]
        if first_grads is None:
            first_grads = [gr.detach().clone() for gr in grads]
        losses.append(float(loss))
        _adamw_hf(params, grads, m, v, step + 1)
    after = {n: p.detach().numpy() for n, p in zip(trainable, params)}
    return np.array(losses), after, dict(zip(trainable, (gr.numpy() for gr in first_grads)))


def _add_layernorm_stats(model):
    """Gives every LayerNormalization its Mean and InvStdDev outputs (ORT 1.19.2's gradient needs them)."""
    count = 0
    for node in model.graph.node:
        if node.op_type == "LayerNormalization" and len(node.output) == 1:
            node.output.extend([f"{node.name or node.output[0]}_Mean", f"{node.name or node.output[0]}_InvStdDev"])
            count += 1
    return count


def _scale_after_matmul(model):
    """Rewrites ``MatMul(a, Div(b, c))`` into ``Div(MatMul(a, b), c)`` where ORT 1.19.2 mis-fuses it.

    ORT 1.19.2's ScaledSumFusion turns ``x + (Div(u, c) + Div(v, c))`` into ScaledSum, and when
    ``x``'s producer is not itself a Div by a constant it wires that producer's first input
    instead of ``x``. DeBERTa's ``bmm(q, k^T / scale) + (c2p / scale + p2c / scale)`` then sums
    ``q`` where the content-to-content scores belong. With the Div after the MatMul the third
    addend is a scaled operand too, which the fusion handles. Only MatMuls whose output is added
    to a sum are rewritten; the function is the same up to float rounding.
    """
    producer = {o: node for node in model.graph.node for o in node.output}
    consumers = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    moved = {}  # index of a MatMul -> index of the Div that now follows it
    for i, matmul in enumerate(model.graph.node):
        if matmul.op_type != "MatMul":
            continue
        div = producer.get(matmul.input[1])
        if div is None or div.op_type != "Div" or len(consumers.get(div.output[0], [])) != 1:
            continue
        constant = producer.get(div.input[1])
        if constant is None or constant.op_type != "Constant":
            continue
        uses = consumers.get(matmul.output[0], [])
        if len(uses) != 1 or uses[0].op_type != "Add":
            continue
        add = uses[0]
        other = producer.get(add.input[1] if add.input[0] == matmul.output[0] else add.input[0])
        if other is None or other.op_type != "Add":
            continue
        scores, unscaled = matmul.output[0], f"{matmul.output[0]}_unscaled"
        matmul.input[1], matmul.output[0] = div.input[0], unscaled
        div.input[0], div.output[0] = unscaled, scores
        moved[i] = list(model.graph.node).index(div)
    if moved:
        order = [j for j in range(len(model.graph.node)) if j not in moved.values()]
        order = [k for j in order for k in ((j, moved[j]) if j in moved else (j,))]
        nodes = [model.graph.node[j].SerializeToString() for j in order]
        del model.graph.node[:]
        for data in nodes:
            model.graph.node.add().ParseFromString(data)
    return len(moved)


def _shorten_names(model):
    """Renames nodes and intermediate values to short names; graph inputs, outputs, initializers keep theirs.

    The legacy exporter's path-like names (``/features/features.0/features.0.2/Relu_output_0``)
    are most of a small model's bytes, three times over once ORT has written its artifacts.
    """
    keep = {v.name for v in list(model.graph.input) + list(model.graph.output)}
    keep |= {t.name for t in model.graph.initializer}
    renamed = {}
    for i, node in enumerate(model.graph.node):
        node.name = f"{node.op_type}_{i}"
        for j, out in enumerate(node.output):
            if out and out not in keep:
                renamed[out] = f"{node.op_type}_{i}_{j}" if len(node.output) > 1 else f"{node.op_type}_{i}"
                node.output[j] = renamed[out]
    for node in model.graph.node:
        for j, inp in enumerate(node.input):
            if inp in renamed:
                node.input[j] = renamed[inp]
    for info in model.graph.value_info:
        info.name = renamed.get(info.name, info.name)
    return model


def export_case(name, out):
    import copy
    import io

    import onnx
    import torch

    torch.manual_seed(0)
    model, input_names, make_x, make_y, kind = _build(name)
    model.train()
    # An exported Embedding is a Gather: its padding row gets a gradient like any other
    # row (ORT's and jaxort's), so the PyTorch reference must not zero it.
    for module in model.modules():
        if isinstance(module, torch.nn.Embedding):
            module.padding_idx = None
    batches = [make_x() for _ in range(STEPS)]
    batches = [b if isinstance(b, tuple) else (b,) for b in batches]
    labels = [make_y() for _ in range(STEPS)]
    inputs = [torch.stack([b[i] for b in batches[:STEPS]]) for i in range(len(input_names))]
    train_labels = torch.stack(labels[:STEPS])

    buffer = io.BytesIO()
    export_model = copy.deepcopy(model)  # tracing in training mode moves BatchNorm statistics
    torch.onnx.export(export_model, batches[0], buffer, dynamo=False, training=torch.onnx.TrainingMode.TRAINING,
                      do_constant_folding=False, opset_version=17, input_names=input_names,
                      output_names=["logits" if kind == "CrossEntropyLoss" else "output"])
    proto = onnx.load_from_string(buffer.getvalue())
    layernorms = _add_layernorm_stats(proto)
    moved_scales = _scale_after_matmul(proto)
    _shorten_names(proto)
    onnx.checker.check_model(proto, full_check=True)
    initializers = {t.name for t in proto.graph.initializer}
    trainable = [n for n, p in model.named_parameters() if p.requires_grad and n in initializers]
    missing = [n for n, _ in model.named_parameters() if n not in initializers]
    float_inits = [t.name for t in proto.graph.initializer
                   if t.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE)]
    frozen = [n for n in float_inits if n not in trainable]
    if missing:
        raise RuntimeError(f"{name}: parameters without an initializer of that name: {missing}")

    out.mkdir(parents=True, exist_ok=True)
    onnx.save(proto, str(out / "model.onnx"))
    arrays = {}
    for i, n in enumerate(input_names):
        arrays[f"train::{n}"] = inputs[i].numpy()
    arrays["train::labels"] = train_labels.numpy()
    np.savez_compressed(out / "batches.npz", **arrays)

    loss64, after64, grads64 = _trajectory(model, trainable, inputs, train_labels, kind, torch.float64)
    loss32, after32, _ = _trajectory(model, trainable, inputs, train_labels, kind, torch.float32)
    drift = max(float(np.abs(after32[n] - after64[n]).max()) for n in trainable)
    reference = {"float64::losses": loss64, "float32::losses": loss32.astype(np.float64)}
    # Stored as float32: the comparisons they serve are far looser than float32 rounding.
    reference.update({f"float64::grad0::{n}": g.astype(np.float32) for n, g in grads64.items()})
    np.savez_compressed(out / "torch_reference.npz", **reference)
    # Read and removed by stage 2, which compares ORT's parameters with it.
    np.savez(out / TRAJECTORY, **{f"float64::after::{n}": p for n, p in after64.items()})
    case = {
        "name": name,
        "description": DESCRIPTIONS[name],
        "input_names": input_names,
        "output_name": proto.graph.output[0].name,
        "loss": kind,
        "learning_rate": LR,
        "steps": STEPS,
        "requires_grad": trainable,
        "frozen_params": frozen,
        "layernorm_stats_added": layernorms,
        "scales_moved_after_matmul": moved_scales,
        "torch_float32_vs_float64_param_drift": drift,
        "versions": {"torch": torch.__version__, "onnx": onnx.__version__,
                     **_versions("torchvision", "transformers")},
    }
    (out / "case.json").write_text(json.dumps(case, indent=1) + "\n")
    print(f"{name}: {len(proto.graph.node)} nodes, {sum(p.size for p in after64.values())} trainable values, "
          f"float32/float64 drift {drift:.2e}")


def _versions(*names):
    import importlib

    return {n: importlib.import_module(n).__version__ for n in names}


# stage 2: ONNX Runtime Training ----------------------------------------------------------------


def _loss_path_ops(training_model, n_user_outputs):
    """Op types (domain::op) in the backward slice of the first ``n_user_outputs`` graph outputs."""
    producer = {o: node for node in training_model.graph.node for o in node.output}
    seen, stack, ops = set(), [o.name for o in training_model.graph.output[:n_user_outputs]], {}
    while stack:
        name = stack.pop()
        node = producer.get(name)
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        key = f"{node.domain or 'ai.onnx'}::{node.op_type}"
        ops[key] = ops.get(key, 0) + 1
        stack.extend(i for i in node.input if i)
    return dict(sorted(ops.items()))


def _standard(key):
    """Whether ``domain::op`` is an ONNX standard op (ORT writes SimplifiedLayerNormalization in domain "")."""
    import onnx

    domain, op = key.split("::")
    return domain == "ai.onnx" and onnx.defs.has(op, "")


def ort_case(out):
    import onnx
    import onnxruntime

    onnxruntime.set_default_logger_severity(3)
    case = json.loads((out / "case.json").read_text())
    model = onnx.load(str(out / "model.onnx"))
    if not (out / TRAJECTORY).exists():
        raise FileNotFoundError(f"{out / TRAJECTORY}: run stage export for {case['name']} first")
    for stale in ("training_model.onnx", "eval_model.onnx", "optimizer_model.onnx", "checkpoint", "expected.npz"):
        (out / stale).unlink(missing_ok=True)
    try:
        return _ort_train(out, case, model)
    except _OrtGap as e:
        error = str(e)
    # No ORT reference: the tests compare with float32 and float64 PyTorch instead.
    for stale in ("training_model.onnx", "eval_model.onnx", "optimizer_model.onnx", "checkpoint"):
        (out / stale).unlink(missing_ok=True)
    (out / TRAJECTORY).unlink()
    loss_path = _loss_path_ops(onnx.load(str(out / "model.onnx")), 1)
    info = {
        "ort_error": error,
        "losses": None,
        "eval_loss": None,
        "loss_path_ops": loss_path,
        "nonstandard_loss_path_ops": [k for k in loss_path if not _standard(k)],
        "ill_conditioned": bool(case["torch_float32_vs_float64_param_drift"] > PARAM_ATOL),
        "versions": {"onnxruntime": onnxruntime.__version__, "onnx": onnx.__version__, "numpy": np.__version__},
    }
    (out / "expected.json").write_text(json.dumps(info, indent=1) + "\n")
    size = sum(p.stat().st_size for p in out.iterdir())
    print(f"{case['name']}: no ORT reference, {size / 1024:.0f} KB: {error}")
    return case, info, size


def _expand_scaled_sum(model):
    """Writes each com.microsoft ScaledSum as Mul and Add (its definition); returns how many.

    ORT 1.19.2 writes ScaledSum (ScaledSumFusion, DeBERTa's attention scores) into training
    models but has CUDA and ROCm kernels for it only; its CPU Module trains this copy instead.
    """
    import onnx
    from onnx import helper, numpy_helper

    nodes, count = [], 0
    for node in model.graph.node:
        if node.domain != "com.microsoft" or node.op_type != "ScaledSum":
            nodes.append(node)
            continue
        count += 1
        scales = {a.name: a.f for a in node.attribute}
        terms = []
        for k, name in enumerate(node.input):
            if not name:
                continue
            scale = f"{node.name}/scale_{k}"
            model.graph.initializer.append(
                numpy_helper.from_array(np.array(scales.get(f"scale_{k}", 1.0), np.float32), scale))
            terms.append(f"{node.name}/term_{k}")
            nodes.append(helper.make_node("Mul", [name, scale], [terms[-1]], name=f"{node.name}/Mul_{k}"))
        total = terms[0]
        for k, term in enumerate(terms[1:]):
            out = node.output[0] if k == len(terms) - 2 else f"{node.name}/sum_{k}"
            nodes.append(helper.make_node("Add", [total, term], [out], name=f"{node.name}/Add_{k}"))
            total = out
    if count:
        copies = [onnx.NodeProto() for _ in nodes]
        for copy, node in zip(copies, nodes):
            copy.CopyFrom(node)
        del model.graph.node[:]
        model.graph.node.extend(copies)
    return count


class _OrtGap(Exception):
    """ORT 1.19.2 cannot make or load its artifacts of a model (no gradient builder, no CPU kernel)."""


def _ort_train(out, case, model):
    """ORT's artifacts of ``model`` and its 5 training steps; raises where ORT 1.19.2 cannot."""
    import onnx
    import onnxruntime
    from onnxruntime.training import artifacts
    from onnxruntime.training.api import CheckpointState, Module, Optimizer

    try:
        artifacts.generate_artifacts(
            model,
            requires_grad=case["requires_grad"],
            frozen_params=case["frozen_params"],
            loss=artifacts.LossType[case["loss"]],
            optimizer=artifacts.OptimType.AdamW,
            artifact_directory=str(out),
        )
    except Exception as e:
        raise _OrtGap(" ".join(str(e).split())) from e
    with np.load(out / "batches.npz") as f:
        batches = {k: f[k] for k in f.files}

    training_path = out / "training_model.onnx"
    cpu_training = onnx.load(str(training_path))
    scaled_sums = _expand_scaled_sum(cpu_training)
    if scaled_sums:  # the committed training model keeps ORT's ScaledSum
        scratch = tempfile.TemporaryDirectory()
        training_path = pathlib.Path(scratch.name) / "training_model.onnx"
        onnx.save(cpu_training, str(training_path))
    state = CheckpointState.load_checkpoint(str(out / "checkpoint"))
    try:
        module = Module(str(training_path), state, str(out / "eval_model.onnx"), device="cpu")
        eval_loads = True
    except Exception:  # ORT 1.19.2 rejects its own eval model for a 3-output BatchNormalization
        state = CheckpointState.load_checkpoint(str(out / "checkpoint"))
        try:
            module = Module(str(training_path), state, device="cpu")
        except Exception as e:  # a gradient op without a CPU kernel
            raise _OrtGap(" ".join(str(e).split())) from e
        eval_loads = False
    optimizer = Optimizer(str(out / "optimizer_model.onnx"), module)
    optimizer.set_learning_rate(case["learning_rate"])
    module.train()
    train_input_names = list(module.input_names())
    with np.load(out / "torch_reference.npz") as f:
        ref = {k: f[k] for k in f.files}
    losses, timed, grad_error = [], 0.0, 0.0
    for step in range(case["steps"]):
        args = [batches[f"train::{n}"][step] for n in case["input_names"]] + [batches["train::labels"][step]]
        start = time.perf_counter()
        loss = module(*args)
        if step == 0:
            grad_error = max(float(np.abs(state.parameters[n].grad - ref[f"float64::grad0::{n}"]).max())
                             for n in case["requires_grad"])
            start = time.perf_counter()
        optimizer.step()
        module.lazy_reset_grad()
        if step >= 2:
            timed += time.perf_counter() - start
        losses.append(float(np.asarray(loss)))
    expected = {"losses": np.array(losses)}
    # Copies: Parameter.data can alias ORT's buffers.
    for name in case["requires_grad"] + case["frozen_params"]:
        expected[f"after::{name}"] = np.array(state.parameters[name].data, copy=True)
    eval_loss = None
    if eval_loads:
        module.eval()
        # The eval step reuses the first training batch (one batch less to store).
        args = [batches[f"train::{n}"][0] for n in case["input_names"]] + [batches["train::labels"][0]]
        eval_loss = float(np.asarray(module(*args)))
    np.savez_compressed(out / "expected.npz", **expected)

    with np.load(out / TRAJECTORY) as f:
        ref.update({k: f[k] for k in f.files})
    (out / TRAJECTORY).unlink()
    ort_vs_64 = max(float(np.abs(expected[f"after::{n}"] - ref[f"float64::after::{n}"]).max())
                    for n in case["requires_grad"])
    loss_rel = float(np.max(np.abs(expected["losses"] - ref["float64::losses"]) / np.abs(ref["float64::losses"])))
    training = onnx.load(str(out / "training_model.onnx"))
    n_outputs = len(onnx.load(str(out / "eval_model.onnx")).graph.output)
    loss_path = _loss_path_ops(training, n_outputs)
    info = {
        "ort_input_names": train_input_names,
        "losses": losses,
        "eval_loss": eval_loss,
        "ort_eval_model_loads": eval_loads,
        "ort_trained_scaled_sum_as_mul_add": scaled_sums,
        "ort_train_steps_per_s": 3.0 / timed,
        "loss_path_ops": loss_path,
        "nonstandard_loss_path_ops": [k for k in loss_path if not _standard(k)],
        "ort_vs_torch_float64_param_max_abs": ort_vs_64,
        "ort_vs_torch_float64_loss_max_rel": loss_rel,
        "ort_vs_torch_float64_grad0_max_abs": grad_error,
        "ill_conditioned": bool(ort_vs_64 > PARAM_ATOL or case["torch_float32_vs_float64_param_drift"] > PARAM_ATOL),
        "versions": {"onnxruntime": onnxruntime.__version__, "onnx": onnx.__version__, "numpy": np.__version__},
    }
    (out / "expected.json").write_text(json.dumps(info, indent=1) + "\n")
    size = sum(p.stat().st_size for p in out.iterdir())
    print(f"{case['name']}: {info['ort_train_steps_per_s']:.1f} steps/s, {size / 1024:.0f} KB, "
          f"ORT vs float64 {ort_vs_64:.1e}, ill-conditioned {info['ill_conditioned']}, "
          f"{info['nonstandard_loss_path_ops']}")
    return case, info, size


README_HEAD = """# Real-model corpus

Written by `tools/make_model_corpus.py` (stage `export` with torch 2.13.0 CPU,
torchvision 0.28.0, transformers 5.24.0 (5.25.0 for `swin`, `llama`, `levit`,
`wav2vec2`, `deberta`, `bart`; each `case.json` records its versions), onnx 1.16.2; stage `ort`
with onnxruntime-training 1.19.2, onnx 1.16.2, numpy 2.2). Random
initialisation, tiny configs, no downloaded weights. docs/real-models.md says
how and why.

Each folder:

- `model.onnx`: the forward model (legacy `torch.onnx.export`, training mode,
  opset 17, no constant folding) given to `generate_artifacts`;
- `training_model.onnx`, `eval_model.onnx`, `optimizer_model.onnx`,
  `checkpoint`: what ORT's `generate_artifacts` wrote (requires_grad = every
  float parameter, frozen = the float buffers, AdamW defaults);
- `batches.npz`: `train::<input>` and `train::labels` stacked over the 5
  steps (float inputs are multiples of 1/4, exact in float32); the eval step
  uses batch 0;
- `case.json`: names, loss, learning rate (0.001), parameter lists;
- `expected.npz`: ORT's `losses` of the 5 train steps (each followed by
  `optimizer.step()` and `lazy_reset_grad()`) and `after::<param>` for every
  parameter and frozen buffer;
- `expected.json`: the losses, ORT's eval loss after training (when ORT's
  Module loads its eval model), train steps/s over steps 3-5, the op types in
  the backward slice of the loss in `training_model.onnx`, and whether the
  float32 run is ill-conditioned;
- `torch_reference.npz`: float64 PyTorch gradients at the initial parameters
  on batch 0 (`float64::grad0::<param>`), and float64 PyTorch's trajectory of
  the same AdamW steps (`float64::losses`, `float64::after::<param>`,
  stored as float32) and float32 PyTorch's losses.

Workarounds for ORT 1.19.2: in `mobilenet_v3_small` HardSwish and HardSigmoid
are written with Relu before export (no ORT gradient builder); every
LayerNormalization was given its Mean and InvStdDev outputs (ORT's gradient
needs them); where ORT's Module rejects its own eval model (training-mode
BatchNormalization with three outputs) ORT trained without it.

No ORT reference: `levit` keeps its HardSwish and `wav2vec2` its GroupNorm,
exported as InstanceNormalization (ORT has no gradient builder for either),
and `unet` its nearest Resize (ORT has no CPU kernel for ResizeGrad).
Those folders hold no ORT artifacts and no `expected.npz`; `expected.json`
gives ORT's error (`ort_error`) and the ops on the loss path of `model.onnx`,
and the tests compare jaxort with float32 PyTorch's losses and float64
PyTorch's gradients instead. Their rows below list the non-standard ops of
`model.onnx`'s forward (there is no ORT training model) and no ORT speed.

Export workaround: `llama` is called with an all-ones attention mask; without
one, transformers looks for packed sequences in the position ids with
`torch.diff`, which the legacy exporter cannot write.

`deberta`: ORT 1.19.2's ScaledSumFusion wires the wrong tensor into the
ScaledSum of DeBERTa's attention scores when the content-to-content term is
`MatMul(q, Div(k^T, c))` (it takes the MatMul's first input, `q`), so stage 1
writes that term as `Div(MatMul(q, k^T), c)`, the same function. ORT has no
CPU kernel for ScaledSum: `training_model.onnx` keeps it, and ORT's reference
run trained a copy with each ScaledSum written as Mul and Add.

`bart`: the classification head pools the decoder's hidden state at the `</s>`
tokens with a boolean mask, exported as Equal(input_ids, 2), NonZero,
Transpose, GatherND, Reshape, Gather: a shape set by the input's values, on
the loss path (ORT differentiates it with GatherNDGrad). BART requires the
same number of `</s>` in every row: the ids are drawn from [3, 64) and each
row ends with one `</s>` (id 2). Built with `use_cache=False` (the decoder's
key/value cache adds Concats onto an empty tensor). ORT needed no workaround.

ORT steps/s: train step + optimizer step + lazy_reset_grad, timed over steps
3-5 on two shared CPU cores; noisy (a factor of a few between runs).

| case | model | non-standard ops on the loss path | size | ORT steps/s | ill-conditioned |
|---|---|---|---|---|---|
"""


def main(argv):
    if len(argv) < 2 or argv[1] not in ("export", "ort"):
        print(__doc__)
        return 2
    out = pathlib.Path(argv[2]) if len(argv) > 2 else DEFAULT_OUT
    only = argv[3].split(",") if len(argv) > 3 else CASES
    if argv[1] == "export":
        _import_torchvision()
        for name in only:
            export_case(name, out / name)
        return 0
    rows = {}
    for name in only:
        case, info, size = ort_case(out / name)
        ops = ", ".join(k.split("::")[1] for k in info["nonstandard_loss_path_ops"]) or "none"
        speed = f"{info['ort_train_steps_per_s']:.0f}" if info["losses"] is not None else "no ORT reference"
        rows[name] = (f"| `{name}` | {case['description']} | {ops} | {size / 1024:.0f} KB | "
                      f"{speed} | {'yes' if info['ill_conditioned'] else 'no'} |")
    readme = out / "README.md"
    if readme.exists():  # the rows of cases not run this time stay as they were
        for line in readme.read_text().splitlines():
            name = line.split("`")[1] if line.startswith("| `") else None
            if name in CASES and name not in rows:
                rows[name] = line
    readme.write_text(README_HEAD + "\n".join(rows[n] for n in CASES if n in rows) + "\n")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main(sys.argv))
