"""Write a tiny random-weight Llama (config.json and a placeholder tokenizer, no weights: load it
with ``load_format=dummy``) whose steps take about a millisecond on a CPU, so a serving
benchmark measures the HTTP front end and the engine loop rather than the model.

    PYTHONPATH=. python benchmarks/tiny_model.py DIR
    python benchmarks/serve.py --overhead --engine-flag model=DIR --engine-flag load_format=dummy ...
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from tessel.engine.engine_setup import placeholder_tokenizer

CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "vocab_size": 10240, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32",
}


def write_tiny_model(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(CONFIG, indent=1))
    placeholder_tokenizer(CONFIG["vocab_size"], CONFIG["eos_token_id"]).save_pretrained(directory)
    return directory


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("directory")
    write_tiny_model(Path(ap.parse_args().directory))


if __name__ == "__main__":
    main()
