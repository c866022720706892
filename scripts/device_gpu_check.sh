#!/usr/bin/env bash
# `make gpu-check` on a lent GPU node, in one call of at most ~7 minutes (docs/emulated-node.md,
# "Real GPU calibration"). Run from the repository root:
#
#   bash scripts/device_gpu_check.sh
#
# The node has python3 with a CUDA PyTorch, transformers, pandas, pyarrow and nvidia-ml-py, no
# internet and no .venv: Snakemake, Zeus, pandas and the rest of envs/venv.lock's versions come
# as wheels in .whl/ (installed into /tmp/site, put first on PYTHONPATH), and the check runs with
# that python3 (make gpu-check USE_SYSTEM_PYTHON=1). It changes no power limit or clock.
#
# What comes back, in $OUT (at most 8 files, each well under 16 MiB):
#   device.log              everything printed here (nvidia-smi, the imports, the check's table)
#   gpu-check.json          every figure of the check (results/gpu-check.json)
#   table.txt               the printed table
#   summary.csv             the sweep's summary (one row per point, with its verdict)
#   gpu-check-files.tar.gz  the sweep's log, the reader's log, the intervals and their readings,
#                           energy.parquet, every job.json and power.parquet, the rule logs
#   samples.csv.gz          the independent reader's 100 Hz samples
set -u
OUT=${OUT:-/tmp/gpu-check-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/device.log") 2>&1
T0=$(date +%s)
say() { echo "== [$(($(date +%s) - T0)) s] $*"; }

say "$(date -u) on $(hostname), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
nvidia-smi || say "WARNING: nvidia-smi failed (rc $?)"
nvidia-smi --query-gpu=name,uuid,driver_version,power.draw,power.limit,clocks.sm,temperature.gpu \
  --format=csv || true
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv || true

SITE=/tmp/site
if compgen -G ".whl/*.whl" >/dev/null; then
  say "installing $(ls .whl/*.whl | wc -l) wheels from .whl/ into $SITE"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" .whl/*.whl || say "WARNING: installing the wheels failed (rc $?)"
else
  say "WARNING: no .whl/*.whl here: Snakemake and Zeus must already be importable"
fi
export PYTHONPATH="$SITE:$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
"${GPU_CHECK_PYTHON:-python3}" - <<'PY' || say "WARNING: an import failed (above); the check will say where it stops"
import importlib, sys
print("python", sys.version.split()[0], sys.executable)
for name in ("torch", "transformers", "snakemake", "zeus", "pandas", "pyarrow", "pynvml",
             "numpy", "yaml", "jsonschema", "energysweep"):
    try:
        m = importlib.import_module(name)
        print(f"  {name:13} {getattr(m, '__version__', '?'):14} {getattr(m, '__file__', '')}")
    except Exception as exc:
        print(f"  {name:13} NOT IMPORTABLE: {type(exc).__name__}: {exc}")
import torch
print("  cuda", torch.version.cuda, "available", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
PY

# The check: preflight (10 s), the sweep (bounded by --timeout), the table. The outer timeout is
# a backstop; SIGTERM makes the check stop its sweep and reader before it exits.
# GPU_CHECK_PYTHON / GPU_CHECK_EXTRA: another interpreter, more arguments (the script's own test
# runs it on the emulated node with .venv's python: GPU_CHECK_EXTRA=--emulated).
PY=${GPU_CHECK_PYTHON:-python3}
ARGS="--timeout ${GPU_CHECK_SWEEP_S:-320} ${GPU_CHECK_EXTRA:-}"
if command -v make >/dev/null; then
  say "make gpu-check USE_SYSTEM_PYTHON=1"
  timeout -k 20 "${GPU_CHECK_LIMIT_S:-380}" make --no-print-directory gpu-check \
    USE_SYSTEM_PYTHON=1 PYTHON="$PY" GPU_CHECK_ARGS="$ARGS"
else  # the same command as the Makefile's USE_SYSTEM_PYTHON=1 recipe
  say "no make here: python3 -m energysweep.validity.gpu_check (the Makefile's command)"
  SLURM_CONF=/dev/null timeout -k 20 "${GPU_CHECK_LIMIT_S:-380}" \
    "$PY" -m energysweep.validity.gpu_check --workflow "$PWD" $ARGS
fi
rc=$?
say "make gpu-check exited $rc"
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv || true

W=results/gpu-check
for f in results/gpu-check.json "$W/table.txt" "$W/summary.csv"; do
  if [ -f "$f" ]; then cp "$f" "$OUT/"; else say "missing: $f"; fi
done
[ -f "$W/samples.csv" ] && gzip -c "$W/samples.csv" >"$OUT/samples.csv.gz"
files=()
for f in "$W/sweep.log" "$W/reader.log" "$W/intervals.csv" "$W/read.csv" \
  "$W/workflow/logs" "$W/workflow/results/energy.parquet" "$W/workflow/results/summary.csv"; do
  [ -e "$f" ] && files+=("$f")
done
while IFS= read -r f; do files+=("$f"); done < <(find "$W/workflow/results/shards" \
  \( -name job.json -o -name power.parquet \) 2>/dev/null)
if [ ${#files[@]} -gt 0 ]; then
  tar czf "$OUT/gpu-check-files.tar.gz" "${files[@]}" || say "WARNING: tar failed"
fi
for f in "$OUT"/*; do  # nothing over 16 MiB comes back: say so rather than lose it silently
  if [ "$(stat -c %s "$f")" -gt 16000000 ]; then
    say "WARNING: $f is over 16 MB, removed"
    rm -f "$f"
  fi
done
ls -la "$OUT"
say "done (check rc $rc)"
exit "$rc"
