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

import numpy as np
import torch
from torch import nn

from kvserve.attention.backend import AttentionBackend
from kvserve.errors import CheckpointError
from kvserve.kernels import cpu_kernels
from kvserve.model.gguf_file import GGUFFile
from kvserve.model.gguf_names import PERMUTED_ARCHITECTURES, gguf_name, llama_rotary_order
from kvserve.model.gguf_tensors import read_tensor
from kvserve.model.layers import MergedLinear
from kvserve.model.quant_linear import QuantizedLinear
from kvserve.model.quant_tensor import QuantizedTensor
from kvserve.model.registry import get_model_class
from kvserve.model.stacked_linear import StackedLinear

Shard = torch.Tensor | QuantizedTensor


@dataclass
class _Projection:
    """One linear of the model and the GGUF tensors that fill its rows."""

    parent: nn.Module
    attr: str
    layer: nn.Linear
    names: list[str]  # Hugging Face names of the shards (e.g. ...self_attn.q_proj)


def load_gguf_model(gguf: GGUFFile, dtype: torch.dtype, device: torch.device | str,
                    backend: AttentionBackend) -> nn.Module:
    """Build and fill the model of an opened GGUF file (module docstring); returns it in eval
    mode.

    Raises:
        CheckpointError: unsupported architecture or tensor type, a missing, unexpected or
            wrongly shaped tensor.
    """
    arch = gguf.arch
    with torch.device("meta"):
        model = get_model_class(arch.architecture)(arch, backend)
    model = model.to(dtype=dtype).to_empty(device=device)
    if arch.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    _GGUFFiller(gguf, model, dtype, device).fill()
    return model.eval()


class _GGUFFiller:
    """Reads every tensor of the file into ``model`` (one at a time)."""

    def __init__(self, gguf: GGUFFile, model: nn.Module, dtype: torch.dtype, device: torch.device | str):
        self.gguf, self.model, self.dtype, self.device = gguf, model, dtype, device
        self.arch = gguf.arch
        self.used: set[str] = set()
        self.kernels = cpu_kernels() if torch.device(device).type == "cpu" else None

    @torch.no_grad()
    def fill(self) -> None:
        tied = self.arch.tie_word_embeddings
        for projection in self._projections():
            self._fill_projection(projection, tied and projection.attr == "lm_head")
        for name, param in self.model.named_parameters():  # a tied lm_head appears as embed_tokens
            if "_proj." in name or name.startswith("lm_head."):
                continue
            value = self._read(gguf_name(name), expected=tuple(param.shape))
            param.data.copy_(value.dequantize() if isinstance(value, QuantizedTensor) else value)
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
                names = ([f"{parent_name}.{s}" for s in child.shard_names] if isinstance(child, MergedLinear)
                         else [full])
                found.append(_Projection(parent, attr, child, names))
        return found

    def _fill_projection(self, proj: _Projection, tied_head: bool) -> None:
        sizes = proj.layer.output_sizes if isinstance(proj.layer, MergedLinear) else [proj.layer.out_features]
        k = proj.layer.in_features
        weight_names = ["token_embd.weight"] if tied_head else [gguf_name(n) + ".weight" for n in proj.names]
        weights = [self._read(g, (n, k), self._rotary_rows(h, n)) for g, h, n in zip(weight_names, proj.names, sizes)]
        biases = None
        if proj.layer.bias is not None:
            biases = [self._read(gguf_name(h) + ".bias", (n,), self._rotary_rows(h, n))
                      for h, n in zip(proj.names, sizes)]
        if tied_head and isinstance(weights[0], torch.Tensor):
            return  # the tied head shares the embedding's float weight, filled below
        if all(isinstance(w, torch.Tensor) for w in weights):
            _copy_rows(proj.layer.weight, weights)
            if biases is not None:
                _copy_rows(proj.layer.bias, biases)
            return
        setattr(proj.parent, proj.attr, self._quantized_layer(weights, biases))

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

    def _read(self, name: str, expected: tuple[int, ...], rows: torch.Tensor | None = None) -> Shard:
        tensor = self.gguf.tensors.get(name)
        if tensor is None:
            raise CheckpointError(f"{self.gguf.path} lacks the tensor {name!r}")
        shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
        if shape != expected:
            raise CheckpointError(f"tensor {name!r} in {self.gguf.path.name} has shape {shape}, expected {expected}")
        self.used.add(name)
        return read_tensor(tensor, rows)

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
