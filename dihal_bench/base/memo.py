"""A one-entry memo for values derived from a model: the last value computed for one model
and key. Suites score many methods or layers in a row against the same model and the same
inputs; holding only the last value bounds memory by one entry."""

from __future__ import annotations

import weakref
from collections.abc import Callable


class LastResult:
    """The last value computed for one model and key. The model is held by a weak reference,
    so the memo neither keeps a model alive nor mistakes a new model at a recycled id() for
    the old one."""

    def __init__(self):
        self._entry: tuple[weakref.ref, tuple, object] | None = None

    def get(self, model: object, key: tuple, compute: Callable[[], object]):
        if self._entry is not None and self._entry[0]() is model and self._entry[1] == key:
            return self._entry[2]
        value = compute()
        self._entry = (weakref.ref(model), key, value)
        return value
