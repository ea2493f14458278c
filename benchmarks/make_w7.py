"""Exports W7, BERT-tiny (2 layers, hidden 64, seq 16, batch 4), as the real-model corpus exports BERT.

Same recipe as ``tools/make_model_corpus.py`` (legacy ``torch.onnx.export`` in
training mode, opset 17, no constant folding, LayerNormalization given its Mean
and InvStdDev outputs for ORT 1.19.2's gradient, short node names), with the
benchmark's shape instead of the corpus' hidden 32 / seq 8. Needs torch and
transformers (not jaxort); writes ``benchmarks/models/w7_bert/model.onnx`` and
``case.json``.

Run: ``python benchmarks/make_w7.py``
"""

from __future__ import annotations

import io
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

BATCH, SEQ, HIDDEN, VOCAB = 4, 16, 64, 128


def main() -> int:
    import onnx
    import torch

    import make_model_corpus as corpus

    corpus._import_torchvision()  # transformers imports it; its wheel's C++ ops may not load
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=4 * HIDDEN, max_position_embeddings=SEQ, type_vocab_size=2,
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=4,
                     attn_implementation="eager")
    wrap = corpus._classifier(lambda m, i: m(input_ids=i, return_dict=False)[0])
    model = wrap(BertForSequenceClassification(cfg))
    model.train()
    for module in model.modules():
        if isinstance(module, torch.nn.Embedding):
            module.padding_idx = None
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    buffer = io.BytesIO()
    torch.onnx.export(model, (ids,), buffer, dynamo=False, training=torch.onnx.TrainingMode.TRAINING,
                      do_constant_folding=False, opset_version=17, input_names=["input_ids"],
                      output_names=["logits"])
    proto = onnx.load_from_string(buffer.getvalue())
    corpus._add_layernorm_stats(proto)
    corpus._shorten_names(proto)
    onnx.checker.check_model(proto, full_check=True)
    initializers = {t.name for t in proto.graph.initializer}
    trainable = [n for n, p in model.named_parameters() if p.requires_grad and n in initializers]
    frozen = [t.name for t in proto.graph.initializer
              if t.data_type == onnx.TensorProto.FLOAT and t.name not in trainable]
    out = ROOT / "benchmarks" / "models" / "w7_bert"
    out.mkdir(parents=True, exist_ok=True)
    onnx.save(proto, str(out / "model.onnx"))
    case = {"description": f"transformers BertForSequenceClassification, 2 layers, hidden {HIDDEN}, "
                           f"seq {SEQ}, vocab {VOCAB}, batch {BATCH}, 4 labels",
            "input_names": ["input_ids"], "input_shape": [BATCH, SEQ], "vocab": VOCAB, "classes": 4,
            "requires_grad": trainable, "frozen_params": frozen,
            "versions": {"torch": torch.__version__, "onnx": onnx.__version__,
                         "transformers": __import__("transformers").__version__}}
    (out / "case.json").write_text(json.dumps(case, indent=1) + "\n")
    print(f"{out.relative_to(ROOT)}: {len(proto.graph.node)} nodes, {(out / 'model.onnx').stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
