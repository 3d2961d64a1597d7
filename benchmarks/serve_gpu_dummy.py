"""``tessel serve`` on a preset's shape with random weights drawn on the GPU (an 8B model's
weights drawn on the host take minutes), for the online benchmarks of issue 5.

    PYTHONPATH=. python benchmarks/serve_gpu_dummy.py --model Llama-3.1-8B --load-format dummy
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.decode_roofline import use_gpu_dummy_weights  # noqa: E402
from tessel.server.cli import main  # noqa: E402

# At import, not under the main guard: the engine process (spawned) imports this file as its
# ``__mp_main__``, and it is the one that draws the weights.
use_gpu_dummy_weights()

if __name__ == "__main__":
    sys.exit(main(["serve", *sys.argv[1:]]))
