"""Default-model load time: cold (GGUF parsed and dequantized, cache written) and warm (from the
converted cache), each in a fresh process, against transformers' own GGUF load.

    python benchmarks/load_time.py [--repeats 3] [--with-transformers]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

TESSEL = """
import json, sys, time
t = time.perf_counter()
import torch, transformers  # what every torch server pays at start, before any loading
t_import = time.perf_counter()
from tessel.config import ModelConfig
from tessel.engine.loader import load_checkpoint
ckpt = load_checkpoint(ModelConfig(cache_dir=sys.argv[1]))
n = sum(w.numel() for _, w in ckpt.weights())
end = time.perf_counter()
print(json.dumps({"seconds": end - t, "load_seconds": end - t_import, "params": n}))
"""

TRANSFORMERS = """
import json, sys, time
t = time.perf_counter()
from transformers import AutoModelForCausalLM, AutoTokenizer
from tessel.engine.loader import default_model_path
path = default_model_path()
AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name)
print(json.dumps({"seconds": time.perf_counter() - t}))
"""


def timed(script: str, *args: str, key: str = "seconds") -> float:
    out = subprocess.run(
        [sys.executable, "-c", script, *args], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    return float(json.loads(out.strip().splitlines()[-1])[key])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--with-transformers", action="store_true")
    args = ap.parse_args()
    rows: list[tuple[str, list[float]]] = [
        ("tessel cold (fresh cache dir), whole process", []),
        ("tessel warm (cached), whole process", []),
        ("tessel warm (cached), after `import torch, transformers`", []),
    ]
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as cache:
            rows[0][1].append(timed(TESSEL, cache))
            rows[1][1].append(timed(TESSEL, cache))
            rows[2][1].append(timed(TESSEL, cache, key="load_seconds"))
    if args.with_transformers:
        rows.append(("transformers from_pretrained(gguf_file=...)", [timed(TRANSFORMERS)]))
    print("Fresh process each, import time included; seconds (median of runs)")
    print("| load | median s | runs |")
    print("|---|---|---|")
    for name, values in rows:
        median = sorted(values)[len(values) // 2]
        print(f"| {name} | {median:.2f} | {', '.join(f'{v:.2f}' for v in values)} |")



if __name__ == "__main__":
    main()
