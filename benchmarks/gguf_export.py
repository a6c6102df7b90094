"""Convert a Hugging Face Llama/Mistral/Qwen2/Qwen3 folder to GGUF (``kvserve.testing.gguf_export``).

    python benchmarks/gguf_export.py /tmp/qwen-shaped /tmp/qwen-shaped/model-bf16.gguf [--outtype q8_0]

Run with kvserve's Python (it has numpy and gguf); llama.cpp's venv only reads the result.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from kvserve.testing.gguf_export import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
