"""Request and response models of ``POST /v1/embeddings`` (OpenAI's shape and vLLM 0.32's
extensions), vLLM's ``POST /pooling`` and ``POST /classify``, and the encodings of a vector in a
response.

This module only parses: the values are checked once by the engine's input processor
(``InputProcessor.process_pooling``). Here are the rules of the HTTP shapes themselves: which
forms ``input`` takes, ``messages`` against ``input``, and the vLLM extensions kvserve does not
implement, refused by name when set to anything but vLLM's default (``UNSUPPORTED_POOLING_FIELDS``).

Sources: OpenAI API reference (``/v1/embeddings``); vLLM 0.32
``vllm/entrypoints/pooling/{base,embed,pooling,classify}/protocol.py``.
"""

from __future__ import annotations

import base64
import sys
import time
from typing import Any, ClassVar, Generic, Literal, TypeVar

import numpy as np
import torch
from pydantic import BaseModel, Field

from kvserve.api.protocol import ChatMessage, OpenAIBaseModel
from kvserve.errors import InvalidRequestError
from kvserve.pooling.params import PoolingParams

# vLLM fields kvserve does not implement: name -> (vLLM's defaults, why).
UNSUPPORTED_POOLING_FIELDS: dict[str, tuple[tuple, str]] = {
    "padding": ((None, "do_not_pad"), "prompts are not padded (padding 'max_length' is not supported)"),
    "mm_processor_kwargs": ((None,), "multimodal inputs are not supported"),
    "media_io_kwargs": ((None,), "multimodal inputs are not supported"),
    "chat_template": ((None,), "a per-request chat template is not accepted; start the server with --chat-template"),
    "tools": ((None,), "tools do not apply to embeddings"),
}
EMBED_DTYPES = {"float32": "f4", "float16": "f2", "bfloat16": None}  # None: through torch (numpy has no bfloat16)


class _PoolingRequestBase(OpenAIBaseModel):
    """Fields ``/v1/embeddings`` and ``/pooling`` share (vLLM's ``PoolingBasicRequestMixin``,
    ``EncodingRequestMixin``, the embed and chat options)."""

    model: str | None = None
    input: Any = None
    messages: list[Any] | None = None
    user: str | None = None
    encoding_format: Literal["float", "base64", "bytes", "bytes_only"] = "float"
    embed_dtype: Literal["float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2"] = "float32"
    endianness: Literal["native", "big", "little"] = "native"
    dimensions: int | None = None
    use_activation: bool | None = None
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)
    truncation_side: Literal["left", "right"] | None = None
    add_special_tokens: bool | None = None  # vLLM: true for input, false for messages
    add_generation_prompt: bool = False
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    request_id: str | None = None
    priority: int = 0
    cache_salt: str | None = None

    def check_http_fields(self) -> None:
        """The rules of the HTTP shape (module docstring).

        Raises:
            InvalidRequestError: ``normalize`` (vLLM's words), a refused extension, ``bytes``
                encodings, an fp8 ``embed_dtype``, both or neither of ``input`` and ``messages``,
                both ``continue_final_message`` and ``add_generation_prompt``.
        """
        extra = self.model_extra or {}
        if "normalize" in extra:
            raise InvalidRequestError("Parameter `normalize` was removed; use `use_activation` instead.",
                                      param="normalize")
        for name, value in extra.items():
            entry = UNSUPPORTED_POOLING_FIELDS.get(name)
            if entry is not None and not any(value is d or value == d for d in entry[0]):
                raise InvalidRequestError(f"{name} is not supported by this server: {entry[1]}", param=name)
        if self.encoding_format in ("bytes", "bytes_only"):
            raise InvalidRequestError(f"encoding_format {self.encoding_format!r} (a binary response) is not "
                                      "supported; use 'float' or 'base64'", param="encoding_format")
        if self.embed_dtype not in EMBED_DTYPES:
            raise InvalidRequestError(f"embed_dtype {self.embed_dtype!r} is not supported; use float32, float16 or "
                                      "bfloat16", param="embed_dtype")
        if self.continue_final_message and self.add_generation_prompt:
            raise InvalidRequestError("Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
                                      param="continue_final_message")

    def pooling_params(self, task: str | None) -> PoolingParams:
        return PoolingParams(task=task, use_activation=self.use_activation, dimensions=self.dimensions,
                             truncate_prompt_tokens=self.truncate_prompt_tokens, truncation_side=self.truncation_side)

    def prompts(self) -> tuple[list[str | list[int]], list[list[dict]] | None]:
        """(the call's text or token-id prompts, or [] and its chat conversations).

        Raises:
            InvalidRequestError: ``input`` is missing or empty, mixes forms, or holds a value that
                is neither text, token ids nor chat messages; ``messages`` beside ``input``.
        """
        if self.messages is not None:
            if self.input is not None:
                raise InvalidRequestError("give either input or messages, not both", param="messages")
            return [], _conversations(self.messages, "messages")
        return _inputs(self.input)


def _is_message(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("role"), str)


def _conversations(value: list[Any], param: str) -> list[list[dict]]:
    """One conversation (a list of messages) or several (a list of such lists)."""
    if value and all(_is_message(m) for m in value):
        return [value]
    if value and all(isinstance(c, list) and c and all(_is_message(m) for m in c) for c in value):
        return list(value)
    raise InvalidRequestError(f"{param} must be a non-empty list of chat messages ({{\"role\", \"content\"}}) or a "
                              "list of such lists", param=param)


def _inputs(value: Any) -> tuple[list[str | list[int]], list[list[dict]] | None]:
    """vLLM's ``input`` forms: a string, strings, token ids, lists of token ids, or chat messages."""
    shape = "input must be a string, a list of strings, a list of token ids or a list of lists of token ids"
    if isinstance(value, str):
        return [value], None
    if not isinstance(value, list):
        raise InvalidRequestError(shape if value is not None else "input is required (or messages)", param="input")
    if not value:
        raise InvalidRequestError("input must not be empty; give at least one string or token id", param="input")
    if all(isinstance(v, str) for v in value):
        return list(value), None
    if all(_is_token_id(v) for v in value):
        return [list(value)], None
    if all(isinstance(v, list) and all(_is_token_id(t) for t in v) for v in value):
        return [list(v) for v in value], None
    if any(_is_message(v) or (isinstance(v, list) and any(_is_message(m) for m in v)) for v in value):
        return [], _conversations(value, "input")
    raise InvalidRequestError(f"{shape}; {_first_misfit(value)}", param="input")


def _first_misfit(value: list[Any]) -> str:
    """Where a list ``input`` leaves every form: the first item (or token id of a list of token
    ids) that does not fit the form its first item starts."""
    if isinstance(value[0], list):
        for i, item in enumerate(value):
            if not isinstance(item, list):
                return f"input[{i}] is {type(item).__name__}, not a list of token ids"
            for j, token in enumerate(item):
                if not _is_token_id(token):
                    return f"input[{i}][{j}] is {token!r}, not a token id (an integer)"
    expected = str if isinstance(value[0], str) else int
    for i, item in enumerate(value):
        if not isinstance(item, expected) or isinstance(item, bool):
            return f"input[{i}] is {type(item).__name__}, not a {'string' if expected is str else 'token id'}"
    return f"input[0] is {type(value[0]).__name__}"


def _is_token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def chat_messages(conversation: list[dict], param: str) -> list[ChatMessage]:
    """A conversation's messages as the chat renderer takes them.

    Raises:
        InvalidRequestError: a message that is not a chat message (named by its index).
    """
    from pydantic import ValidationError

    messages = []
    for i, message in enumerate(conversation):
        try:
            messages.append(ChatMessage.model_validate(message))
        except ValidationError as exc:
            raise InvalidRequestError(f"{param}[{i}] is not a chat message: {exc.errors()[0]['msg']}",
                                      param=f"{param}.{i}") from None
    return messages


class EmbeddingRequest(_PoolingRequestBase):
    """``POST /v1/embeddings``: task ``embed``."""

    api_name: ClassVar[str] = "embeddings"

    @property
    def task_name(self) -> str | None:
        return "embed"


class PoolingRequest(_PoolingRequestBase):
    """``POST /pooling`` (vLLM): ``task`` None = the model's."""

    api_name: ClassVar[str] = "embeddings"
    task: str | None = None

    @property
    def task_name(self) -> str | None:
        return self.task


class ClassificationRequest(_PoolingRequestBase):
    """vLLM's ``POST /classify``: task ``classify`` (a sequence classifier's probabilities per
    input; ``use_activation: false`` gives the logits). The embedding fields (``dimensions``,
    ``encoding_format``, ...) are not vLLM's here: ``dimensions`` is refused for ``classify`` by
    the input processor and the encodings are refused by name unless left at their defaults
    (probabilities are floats)."""

    api_name: ClassVar[str] = "Classification"

    def check_http_fields(self) -> None:
        super().check_http_fields()
        for name, default in (("encoding_format", "float"), ("embed_dtype", "float32"), ("endianness", "native")):
            if getattr(self, name) != default:
                raise InvalidRequestError(f"{name} applies to embeddings; /classify answers probabilities as "
                                          f"floats (omit {name})", param=name)

    @property
    def task_name(self) -> str | None:
        return "classify"


def encode_vector(vector: torch.Tensor, encoding_format: str, embed_dtype: str = "float32",
                  endianness: str = "native") -> list[float] | str:
    """A float32 vector as a response carries it: floats, or base64 of its bytes in ``embed_dtype``
    (OpenAI: little-endian float32) in ``endianness`` (``native``: this machine's)."""
    if encoding_format == "float":
        return vector.tolist()
    order = {"little": "<", "big": ">", "native": "<" if sys.byteorder == "little" else ">"}[endianness]
    if embed_dtype == "bfloat16":
        array = vector.to(torch.bfloat16).view(torch.int16).numpy().astype(order + "i2")
    else:
        array = vector.numpy().astype(order + EMBED_DTYPES[embed_dtype])
    return base64.b64encode(array.tobytes()).decode("ascii")


def decode_base64(data: str, embed_dtype: str = "float32", endianness: str = "little") -> np.ndarray:
    """The inverse of ``encode_vector`` for float32/float16 (tests and clients)."""
    order = "<" if endianness == "little" else ">"
    return np.frombuffer(base64.b64decode(data), dtype=order + EMBED_DTYPES[embed_dtype]).astype(np.float32)


class PoolingUsage(BaseModel):
    """vLLM's ``UsageInfo`` of a pooling call: prompt tokens only."""

    prompt_tokens: int
    total_tokens: int
    completion_tokens: int | None = 0
    prompt_tokens_details: None = None


DataT = TypeVar("DataT")


class PoolingListResponse(BaseModel, Generic[DataT]):
    """The answer of every pooling route (vLLM's shape): the call's id (the route's prefix and
    the request id), ``object`` "list", the time, the model, one entry per input in input order,
    the prompt tokens."""

    id: str
    object: str = "list"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    data: list[DataT]
    usage: PoolingUsage


class EmbeddingData(BaseModel):
    index: int
    object: str = "embedding"
    embedding: list[float] | str


class EmbeddingResponse(PoolingListResponse[EmbeddingData]):
    """``/v1/embeddings`` (id ``embd-...``)."""


class ClassificationData(BaseModel):
    """One input's probabilities; ``label``: the most probable label's name (config.json's
    ``id2label``), or None."""

    index: int
    label: str | None
    probs: list[float]
    num_classes: int


class ClassificationResponse(PoolingListResponse[ClassificationData]):
    """``/classify`` (id ``classify-...``)."""


class PoolingData(BaseModel):
    index: int
    object: str = "pooling"
    data: list[float] | str


class PoolingResponse(PoolingListResponse[PoolingData]):
    """``/pooling`` (id ``pool-...``)."""
