"""The one tokenizer loader: a model directory's (or a file's) `tokenizer.json`, for counting
method 3 (the model's own tokenizer over the streamed text) and for prompts of exact lengths."""

from __future__ import annotations

import os
from typing import Any

from truthput.errors import InputError


def load_tokenizer(path: str | None, *, where: str = "--tokenizer", optional: bool = False) -> Any:
    """`path`: a `tokenizer.json` or a directory holding one. `optional`: a directory without one
    (a model named by a hub id, say) gives None instead of an error; a file that is there but
    cannot be read is an error either way, naming `where`."""
    if not path:
        return None
    file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
    if optional and not os.path.isfile(file):
        return None
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(file)
    except Exception as exc:  # noqa: BLE001 - the tokenizers library raises its own Exception types
        raise InputError(f"{where} {path}: cannot load {file}: {exc}") from None
