"""Pieces of scripts/train_builtin_model.py that decide what the model learns from: the R
serialization reader, paragraph joining, chat-format examples, the word list and the LR schedule."""

from __future__ import annotations

import importlib.util
import random
import struct
import zlib
from argparse import Namespace
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "train_builtin_model.py"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("train_builtin_model", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _serialize_strsxp(lines: list[str | None]) -> bytes:
    """R's ``serialize(x, NULL, xdr=TRUE, version=3)`` layout for a plain character vector, written
    out by hand from R Internals §1.8 (header, native encoding, STRSXP, CHARSXPs; NA has -1)."""
    out = b"X\n" + struct.pack(">iii", 3, 0x040201, 0x030500) + struct.pack(">i", 5) + b"UTF-8"
    out += struct.pack(">ii", 16, len(lines))
    for line in lines:
        if line is None:
            out += struct.pack(">ii", 9, -1)
        else:
            raw = line.encode("utf-8")
            out += struct.pack(">ii", 0x00048009, len(raw)) + raw
    return out


def test_reads_r_lazy_load_database(script, tmp_path):
    books = {"EMMA": ["EMMA", "", "Emma Woodhouse, handsome, clever, and rich,", None, "café"],
             "PERSUASION": ["", "PERSUASION", "Sir Walter Elliot"]}
    rdb = tmp_path / "Rdata.rdb"
    rdb.write_bytes(b"".join(
        struct.pack(">i", len(raw)) + zlib.compress(raw)
        for raw in (_serialize_strsxp(lines) for lines in books.values())))
    got = script.read_novels(rdb)
    assert got == {"EMMA": ["EMMA", "", "Emma Woodhouse, handsome, clever, and rich,", "", "café"],
                   "PERSUASION": ["", "PERSUASION", "Sir Walter Elliot"]}


def test_rejects_non_character_vector(script):
    raw = bytearray(_serialize_strsxp(["x"]))
    raw[2 + 12 + 4 + 5 + 3] = 13  # INTSXP instead of STRSXP
    with pytest.raises(ValueError, match="STRSXP"):
        script._read_strsxp(bytes(raw))


def test_paragraphs_join_wrapped_lines(script):
    lines = ["CHAPTER I", "", "", "It is a _truth_ universally", "  acknowledged, that", "", "End."]
    assert script.to_paragraphs(lines) == [
        "CHAPTER I", "It is a truth universally acknowledged, that", "End."]


def test_chat_examples_split_sentence_in_half(script):
    paragraphs = ["Short one. She was the youngest of the two daughters of a most affectionate father."]
    [example] = script.chat_examples(paragraphs, random.Random(0), 5)
    # 13 words: the user gets the first 13 // 2 = 6, the assistant the other 7
    assert example == ("<s><|user|>\nShe was the youngest of the</s>\n"
                       "<|assistant|>\ntwo daughters of a most affectionate father.</s>\n")


def test_corpus_words(script):
    assert script.corpus_words(["Don't go, Mr. Darcy!", "don't--said she"]) == [
        "darcy", "don't", "go", "mr", "said", "she"]


def test_lr_schedule(script):
    args = Namespace(lr=1e-3, warmup=10, max_steps=110)
    assert script.lr_at(0, args) == pytest.approx(1e-4)
    assert script.lr_at(9, args) == pytest.approx(1e-3)
    assert script.lr_at(60, args) == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5))
    assert script.lr_at(110, args) == pytest.approx(1e-4)
