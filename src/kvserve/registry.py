"""Plugins by name (reasoning parsers, tool parsers, structured-output backends): a class
decorator registers one; the built-in ones register when their module is first imported, on the
first lookup."""

from __future__ import annotations

import importlib
from typing import Callable, Generic, TypeVar

T = TypeVar("T", bound=type)


class Registry(Generic[T]):
    """Classes by name.

    Args:
        kind: what a name names, for the error (``"tool call parser"``).
        builtins: the module whose import registers the built-in classes.
    """

    def __init__(self, kind: str, builtins: str):
        self._kind = kind
        self._builtins = builtins
        self._classes: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Class decorator: the class under ``name`` (also set as its ``name`` attribute)."""

        def wrap(cls: T) -> T:
            self._classes[name] = cls
            cls.name = name
            return cls

        return wrap

    def get(self, name: str) -> T:
        """The class registered as ``name``.

        Raises:
            ValueError: an unknown name (a configuration error at start; lists the names).
        """
        importlib.import_module(self._builtins)
        if name not in self._classes:
            raise ValueError(f"unknown {self._kind} {name!r}; allowed: {', '.join(sorted(self._classes))}")
        return self._classes[name]

    def names(self) -> list[str]:
        """The registered names, sorted (a flag's choices)."""
        importlib.import_module(self._builtins)
        return sorted(self._classes)
