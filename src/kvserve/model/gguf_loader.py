"""Load a GGUF file into one of our models (``load_model`` calls this for ``model.gguf`` or a
folder holding one).

The module is built on the ``meta`` device from the file's ``ModelArchConfig``
(``kvserve.model.gguf_file``), given empty storage, and filled tensor by tensor
(``kvserve.model.gguf_tensors.read_tensor``; names from ``kvserve.model.gguf_names``):

- float tensors (F32, F16, BF16) are cast to the model dtype (norms, biases, float matrices);
- quantized matrices become ``QuantizedLinear`` layers holding the file's integers and scales
  exactly (Q8_0 -> int8 group 32, Q6_K -> int8 group 16, Q4_0 -> int4 group 32 symmetric,
  Q4_K -> int4 group 32 with zero points); the shards of a fused projection (q/k/v, gate/up)
  share one layer when they have one format, else one layer per run of shards of one format
  (``StackedLinear``);
- a quantized ``token_embd`` is dequantized for the lookup (in the model dtype); as the LM head
  of a tied model it stays quantized;
- llama files' q/k rows are put back in Hugging Face's rotate-half order; a ``rope_freqs``
  tensor (Llama 3.1 files) divides the rotary frequencies.

Any other tensor in the file, and any missing one, stops the load with one line naming it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from kvserve.attention.backend import AttentionBackend
from kvserve.errors import CheckpointError, ConfigError
from kvserve.kernels import kernels_for
from kvserve.model.gguf_file import GGUFFile
from kvserve.model.gguf_names import PERMUTED_ARCHITECTURES, gguf_name, llama_rotary_order
from kvserve.model.gguf_tensors import block_size, read_tensor
from kvserve.model.kernel_layer import bind_kernels
from kvserve.model.layers import MergedLinear
from kvserve.model.meta_init import materialize
from kvserve.model.quant_linear import QuantizedLinear
from kvserve.model.quant_tensor import QuantizedTensor
from kvserve.model.registry import get_model_class
from kvserve.model.stacked_linear import StackedLinear

if TYPE_CHECKING:
    from kvserve.distributed.communicator import Communicator
    from kvserve.distributed.shard import TensorParallelShard

Shard = torch.Tensor | QuantizedTensor


@dataclass
class _Projection:
    """One linear of the model and the GGUF tensors that fill its rows."""

    parent: nn.Module
    attr: str
    layer: nn.Linear
    names: list[str]  # Hugging Face names of the shards (e.g. ...self_attn.q_proj)


def load_gguf_model(gguf: GGUFFile, dtype: torch.dtype, device: torch.device | str,
                    backend: AttentionBackend, shard: TensorParallelShard | None = None,
                    communicator: Communicator | None = None) -> nn.Module:
    """Build and fill the model of an opened GGUF file (module docstring); returns it in eval
    mode. With ``shard`` (and its ``communicator``), only a tensor-parallel rank's part: the
    model has the rank's sizes and row-parallel layers (``kvserve.distributed.layers``), and each
    matrix is read in the rank's rows (column-parallel, vocabulary) or columns (row-parallel, in
    whole quantization blocks) straight from the memory map (``kvserve.distributed.shard``).

    Raises:
        CheckpointError: unsupported architecture or tensor type, a missing, unexpected or
            wrongly shaped tensor.
        ConfigError: a row-parallel matrix whose rank columns are not whole blocks of its type.
    """
    arch = gguf.arch
    with torch.device("meta"):
        model = get_model_class(arch.architecture)(arch if shard is None else shard.local_arch(), backend)
        if shard is not None:
            from kvserve.distributed.layers import parallelize

            parallelize(model, shard, communicator)
    model = materialize(model.to(dtype=dtype), device)
    bind_kernels(model, device, triton=backend.name == "triton")
    if arch.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    _GGUFFiller(gguf, model, dtype, device, shard).fill()
    return model.eval()


class _GGUFFiller:
    """Reads every tensor of the file into ``model`` (one at a time)."""

    def __init__(self, gguf: GGUFFile, model: nn.Module, dtype: torch.dtype, device: torch.device | str,
                 shard: TensorParallelShard | None = None):
        self.gguf, self.model, self.dtype, self.device, self.shard = gguf, model, dtype, device, shard
        self.arch = gguf.arch
        self.used: set[str] = set()
        self.kernels = kernels_for(device)

    @torch.no_grad()
    def fill(self) -> None:
        tied = self.arch.tie_word_embeddings
        for projection in self._projections():
            self._fill_projection(projection, tied and projection.attr == "lm_head")
        for name, param in self.model.named_parameters():  # a tied lm_head appears as embed_tokens
            if name.startswith("lm_head.") or ("_proj." in name and not self._row_parallel_bias(name)):
                continue
            rows = self._rows(name)
            value = self._read(gguf_name(name), (param.shape[0] if rows is None else len(rows), *param.shape[1:]),
                               rows)
            value = value.dequantize() if isinstance(value, QuantizedTensor) else value
            param.data[: value.shape[0]].copy_(value)
            param.data[value.shape[0] :].zero_()  # the padding rows of the last vocabulary shard
        self._apply_rope_freqs()
        unexpected = sorted(set(self.gguf.tensors) - self.used)
        if unexpected:
            raise CheckpointError(f"{self.gguf.path}: unexpected tensor {unexpected[0]!r} "
                                  f"({len(unexpected)} in all); this {self.arch.architecture} has no such weight")

    def _projections(self) -> list[_Projection]:
        found = []
        for parent_name, parent in self.model.named_modules():
            for attr, child in parent.named_children():
                if not isinstance(child, nn.Linear):
                    continue
                full = f"{parent_name}.{attr}" if parent_name else attr
                if attr == "linear":  # a row-parallel layer's inner linear: the layer's tensor
                    full = parent_name
                names = ([f"{parent_name}.{s}" for s in child.shard_names] if isinstance(child, MergedLinear)
                         else [full])
                found.append(_Projection(parent, attr, child, names))
        return found

    def _fill_projection(self, proj: _Projection, tied_head: bool) -> None:
        sizes = proj.layer.output_sizes if isinstance(proj.layer, MergedLinear) else [proj.layer.out_features]
        k = proj.layer.in_features
        weight_names = ["token_embd.weight"] if tied_head else [gguf_name(n) + ".weight" for n in proj.names]
        rows = [self._rows(h) if self.shard is not None else self._rotary_rows(h, n)
                for h, n in zip(proj.names, sizes)]
        columns = self._columns(proj.names[0])
        weights = [self._read(g, (n if r is None else len(r), k), r, columns)
                   for g, r, n in zip(weight_names, rows, sizes)]
        biases = None
        if proj.layer.bias is not None:
            biases = [self._read(gguf_name(h) + ".bias", (n,), r) for h, r, n in zip(proj.names, rows, sizes)]
        if tied_head and isinstance(weights[0], torch.Tensor):
            return  # the tied head shares the embedding's float weight, filled below
        if all(isinstance(w, torch.Tensor) for w in weights):
            _copy_rows(proj.layer.weight, weights)
            proj.layer.weight.data[sum(w.shape[0] for w in weights) :].zero_()  # vocabulary padding rows
            if biases is not None:
                _copy_rows(proj.layer.bias, biases)
            return
        if sum(w.shape[0] for w in weights) < sum(sizes):  # the last vocabulary shard: zero rows
            weights = [_pad_rows(weights[0], sizes[0])]
        setattr(proj.parent, proj.attr, self._quantized_layer(weights, biases))

    # -- a tensor-parallel rank's part (kvserve.distributed.shard) ---------------------------------

    def _rows(self, hf_name: str) -> torch.Tensor | None:
        """The file rows (int64, in Hugging Face order) of tensor or module ``hf_name`` this
        process holds; None = all, in the file's order (no shard, or a whole tensor)."""
        if self.shard is None:
            return None
        module = hf_name.removesuffix(".weight").removesuffix(".bias")
        projection = module.rpartition(".")[2]
        if module in ("model.embed_tokens", "lm_head"):
            return torch.arange(*self.shard.vocab_rows)
        if projection not in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"):
            return None
        heads = {"q_proj": self.arch.num_attention_heads, "k_proj": self.arch.num_key_value_heads,
                 "v_proj": self.arch.num_key_value_heads}
        total = heads[projection] * self.arch.head_dim if projection in heads else self.arch.intermediate_size
        order = self._rotary_rows(module, total)
        start, end = self.shard.rows_of(projection)
        return (torch.arange(total) if order is None else order)[start:end]

    def _columns(self, hf_name: str) -> tuple[int, int] | None:
        """The input columns of a row-parallel matrix (o_proj, down_proj) this rank holds."""
        projection = hf_name.rpartition(".")[2]
        if self.shard is None or projection not in ("o_proj", "down_proj"):
            return None
        return self.shard.rows_of(projection)

    def _row_parallel_bias(self, name: str) -> bool:
        """A row-parallel layer's bias: whole on every rank, added after the all-reduce."""
        return self.shard is not None and name.endswith(("o_proj.bias", "down_proj.bias"))

    def _quantized_layer(self, weights: list[Shard], biases: list[torch.Tensor] | None) -> nn.Module:
        """One ``QuantizedLinear`` when every shard is quantized alike, else a ``StackedLinear`` of
        one layer per run of consecutive shards of one format."""
        biases = None if biases is None else [b.to(self.device, torch.float32) for b in biases]
        runs: list[list[int]] = []
        for i, weight in enumerate(weights):
            if runs and _form(weights[runs[-1][0]]) == _form(weight):
                runs[-1].append(i)
            else:
                runs.append([i])
        parts = [self._layer([weights[i] for i in run], None if biases is None else [biases[i] for i in run])
                 for run in runs]
        return parts[0] if len(parts) == 1 else StackedLinear(parts)

    def _layer(self, weights: list[Shard], biases: list[torch.Tensor] | None) -> nn.Module:
        """A layer of shards of one form: ``QuantizedLinear`` or float ``nn.Linear``."""
        bias = None if biases is None else torch.cat(biases)
        if isinstance(weights[0], QuantizedTensor):
            return QuantizedLinear(_concat_quantized(weights).to(self.device), bias, self.kernels)
        rows = sum(w.shape[0] for w in weights)
        layer = nn.Linear(weights[0].shape[1], rows, bias=bias is not None, device=self.device, dtype=self.dtype)
        _copy_rows(layer.weight, weights)
        if bias is not None:
            _copy_rows(layer.bias, [bias])
        return layer

    def _rotary_rows(self, hf_name: str, rows: int) -> torch.Tensor | None:
        """The row order that undoes llama.cpp's q/k permutation (``gguf_names``), or None."""
        if self.gguf.gguf_architecture not in PERMUTED_ARCHITECTURES:
            return None
        if hf_name.endswith("q_proj"):
            heads = self.arch.num_attention_heads
        elif hf_name.endswith("k_proj"):
            heads = self.arch.num_key_value_heads
        else:
            return None
        return torch.from_numpy(np.argsort(llama_rotary_order(rows, heads)))

    def _read(self, name: str, expected: tuple[int, ...], rows: torch.Tensor | None = None,
              columns: tuple[int, int] | None = None) -> Shard:
        """Tensor ``name``'s ``rows`` and ``columns`` (None: all), checked to be ``expected``."""
        tensor = self.gguf.tensors.get(name)
        if tensor is None:
            raise CheckpointError(f"{self.gguf.path} lacks the tensor {name!r}")
        shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
        part = ((shape[0] if rows is None else len(rows)),) + shape[1:]
        if columns is not None:
            part = part[:1] + (columns[1] - columns[0],)
        if part != expected:
            raise CheckpointError(f"tensor {name!r} in {self.gguf.path.name} has shape {shape}, expected {expected}"
                                  + ("" if self.shard is None else f" for tensor-parallel rank {self.shard.rank}"))
        if columns is not None:
            block = block_size(tensor.tensor_type.name)
            if columns[0] % block or columns[1] % block:
                raise ConfigError(f"a GGUF file with --tensor-parallel-size {self.shard.size}: tensor {name!r} is "
                                  f"{tensor.tensor_type.name}, in blocks of {block} inputs, but each rank takes "
                                  f"{columns[1] - columns[0]} of its {shape[1]} inputs; a block would straddle two "
                                  "ranks")
        self.used.add(name)
        return read_tensor(tensor, rows, columns)

    def _apply_rope_freqs(self) -> None:
        tensor = self.gguf.tensors.get("rope_freqs.weight")
        if tensor is None:
            return
        factors = read_tensor(tensor)
        expected = self.arch.head_dim // 2
        if not isinstance(factors, torch.Tensor) or tuple(factors.shape) != (expected,):
            raise CheckpointError(f"tensor 'rope_freqs.weight' in {self.gguf.path.name} must be float [{expected}]")
        self.used.add("rope_freqs.weight")
        self.model.model.rotary_emb.divide_frequencies(factors.to(torch.float32))


def _copy_rows(dest: torch.Tensor, shards: list[torch.Tensor]) -> None:
    start = 0
    for shard in shards:
        dest.data[start:start + shard.shape[0]].copy_(shard)
        start += shard.shape[0]


def _pad_rows(weight: QuantizedTensor, rows: int) -> QuantizedTensor:
    """``weight`` with zero rows (zero scales and offsets: zero outputs) up to ``rows``."""
    extra = rows - weight.q.shape[0]

    def pad(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else torch.cat([t, t.new_zeros((extra, *t.shape[1:]))])

    return QuantizedTensor(pad(weight.q), pad(weight.scales), pad(weight.offsets), weight.bits, weight.group_size)


def _form(weight: Shard) -> tuple:
    """What decides whether shards share one layer: float, or (bits, group size, zero points)."""
    return ("float",) if isinstance(weight, torch.Tensor) else (weight.bits, weight.group_size, weight.symmetric)


def _concat_quantized(weights: list[QuantizedTensor]) -> QuantizedTensor:
    """Shards of one form stacked as one ``QuantizedTensor`` (scales of different dtypes are
    widened to float32, exactly)."""
    first = weights[0]
    if len(weights) == 1:
        return first
    scale_dtype = first.scales.dtype if len({w.scales.dtype for w in weights}) == 1 else torch.float32
    scales = torch.cat([w.scales.to(scale_dtype) for w in weights])
    offsets = None if first.symmetric else torch.cat([w.offsets.to(scale_dtype) for w in weights])
    return QuantizedTensor(torch.cat([w.q for w in weights]), scales, offsets, first.bits, first.group_size)
