#!/usr/bin/env bash
# Every GPU check of slipstream in one go, sized for a GPU lent for a few minutes: the CUDA
# tests, the sampler's cost at Qwen2.5's vocabulary, bench/gpu.py, and the README's "Train on a
# GPU" command on a chat model folder built here. Each part has its own time limit and log, so
# one that fails or runs long does not take the others with it.
#
#   bash bench/gpu_session.sh            # logs and JSON lines under $OUT (default gpu_out/)
#   PARTS="tests engine" bash bench/gpu_session.sh
#
# Every part's limit adds up to more than one 600 s device call: run it as two calls, e.g.
# PARTS="env tests readme engine" then PARTS="env gpu profile".
#
# Where slipstream's dependencies are missing (a machine with torch and transformers but no
# pydantic, say), wheels in .whl/ are installed into /tmp/site first (no network needed):
# `bash bench/gpu_wheels.sh` downloads them beforehand, on a machine with PyPI.
set -u
OUT=${OUT:-gpu_out}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
PARTS=${PARTS:-"env tests engine gpu readme profile"}
DEVICE=${DEVICE:-cuda}  # the README command's trainer.device (cpu: a smoke run of the part)
ROOT=$(pwd)
export PYTHONUNBUFFERED=1 PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
if ! python3 -c "import pydantic" 2>/dev/null; then
    if ! ls .whl/*.whl >/dev/null 2>&1; then  # every part would fail at its first import
        echo "no pydantic here and no wheels in .whl/: run 'bash bench/gpu_wheels.sh' on a" \
            "machine with PyPI first (the device has no network) and carry .whl" >&2
        exit 2
    fi
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
slip() { python3 -c "import sys; from slipstream.cli import main; sys.exit(main())" "$@"; }

part() {  # part NAME SECONDS CMD...: run CMD with a time limit, output to $OUT/NAME.log
    local name=$1 limit=$2 t0=$SECONDS
    shift 2
    case " $PARTS " in *" $name "*) ;; *) return 0 ;; esac
    echo "=== $name (limit ${limit}s)"
    timeout -k 10 "$limit" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    echo "=== $name: exit $rc after $((SECONDS - t0))s"
    tail -n 25 "$OUT/$name.log"
}

env_check() {
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv
    python3 -c "import sys, torch, transformers; print(sys.version.split()[0], torch.__version__, torch.version.cuda, transformers.__version__, torch.cuda.get_device_name(0))"
    python3 -c "import slipstream.cli, pydantic, math_verify; print('slipstream imports')"
}

readme_args() {  # the settings of the README's "Train on a GPU" command, one per line, but
    # the paths and the device, which readme_command sets (so the part runs what users read)
    python3 - <<'PY'
import shlex
text = open("README.md").read().split("## Train on a GPU", 1)[1]
block = text.split("```bash\n", 1)[1].split("```", 1)[0]
args = shlex.split(block.replace("\\\n", " "))
assert args[:2] == ["slipstream", "train"], args[:2]
own = ("model.path=", "task.path=", "trainer.device=")
print("\n".join(a for a in args[2:] if not a.startswith(own)))
PY
}

readme_command() {  # the README's GPU command, on a tiny chat model folder made here
    local w args
    mapfile -t args < <(readme_args) && [ "${#args[@]}" -gt 0 ] || return 1
    w=$(mktemp -d) && python3 tests/chat_model.py "$w" || return 1
    python3 -c "
import json, pyarrow.parquet as pq
rows = pq.read_table('$w/train.parquet').to_pylist()
open('$w/train.jsonl', 'w').write(''.join(json.dumps(r) + '\n' for r in rows))"
    cd "$w" || return 1
    echo "the README's settings: ${args[*]}"
    slip train model.path=model task.path=train.jsonl trainer.device="$DEVICE" "${args[@]}" \
        'task.rewards=[{fn="rewards.py:short_answer", weight=0.5}, {fn="rewards.py:compute_score"}]' \
        run.steps=6 run.dir=run trainer.batch_prompts=4 sampling.group_size=4 \
        sampling.max_new_tokens=16 run.quiet=true
    local rc=$?
    python3 -c "
import json; s = json.load(open('run/summary.json'))
print({k: s.get(k) for k in ('steps', 'placement', 'weight_channel', 'trainer_peak_gib')}, 'ledger balanced:', s['ledger']['balanced'])"
    cp run/summary.json "$OUT/readme_summary.json" 2>/dev/null
    cd "$ROOT" && rm -rf "$w" && return $rc
}

export OUT ROOT DEVICE
export -f slip env_check readme_args readme_command
part env 60 bash -c env_check
# the GPU-only code first (the fused kernel's tests but its compile-without-a-GPU ones); a test
# that hangs is stopped alone (pytest-timeout, on the device image), not the whole part
part tests 180 python3 -m pytest -q -p no:cacheprovider -rs --timeout=100 \
    -k "not compiles_for_a_hopper" tests/test_engine_cuda.py tests/test_engine_fused.py \
    tests/test_engine_devices.py tests/test_pipeline_cuda.py tests/test_runtime_cuda_weights.py \
    tests/test_placement.py tests/test_engine_sampling.py
part readme 100 bash -c readme_command
part engine 120 bash -c "python3 bench/engine.py --part sampling --vocab 151936 --batch 256 \
    --max-new-tokens 32 --repeats 3 && python3 bench/engine.py --part sampling \
    --model qwen2.5-0.5b --dtype bfloat16 --batch 256 --max-new-tokens 32 --repeats 3"
# the 1.5B trainer step peaked at 81.6 GiB on an H200 (stop 29): under 100 GiB of GPU memory
# (an H100's 80 GB) it runs with activation checkpointing, which the JSON line's sizes say
GPU_MIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -n 1)
CKPT=$([ "${GPU_MIB:-0}" -lt 100000 ] 2>/dev/null && echo --checkpointing)
part gpu 180 bash -c "python3 bench/gpu.py --parts trainer,sampler,weights --repeats 2 $CKPT && \
    python3 bench/gpu.py --shapes qwen2.5-0.5b --parts e2e --steps 4 --prompts 16 \
    --completion-len 256"
part profile 150 python3 bench/gpu.py --shapes qwen2.5-0.5b --parts profile --repeats 1 \
    --slots 256 --sampler-new 64
grep -h '^{' "$OUT"/*.log >"$OUT/json_lines.txt" 2>/dev/null
echo "=== done"
