#!/usr/bin/env bash
# The one prepared command for a lent GPU (H200/H100: torch, triton, numpy already there; no
# network, nothing installed): the Triton kernel checked against the torch reference on the
# device, then `feather probe --device cuda` over the full grid. Under 8 minutes, warm-up
# included: the probe stops starting new compositions after PROBE_BUDGET_S (default 300 s, less
# if the start took long) and everything is killed 450 s after the start.
#
#   benchmarks/gpu/run.sh                  # writes into $OUT when set, else benchmarks/gpu/
#   PROBE_DRY_RUN=1 benchmarks/gpu/run.sh  # the same pipeline on a CPU: the Triton kernel
#                                          # under TRITON_INTERPRET=1, tiny-llama, smoke grid
#
# Writes PROFILE.json (fitted hardware profile), RESULTS.json (rows, fit, homogeneity effect,
# machine), plot.png (when matplotlib is there), selfcheck.json and probe.log; with
# PROBE_BENCH=1 (and typer, rich, xxhash, matplotlib importable) also bench.json/bench.png from
# `feather bench --hardware PROFILE.json`, which otherwise runs afterwards on any machine:
#   feather bench --hardware benchmarks/gpu/PROFILE.json --json ... --plot ...
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST="${OUT:-benchmarks/gpu}"
mkdir -p "$DEST"
PY="${PYTHON:-python3}"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
BUDGET="${PROBE_BUDGET_S:-300}"
START=$SECONDS
exec > >(tee "$DEST/probe.log") 2>&1

echo "== feather probe: $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
"$PY" - <<'PYEOF'
import importlib.util, sys
need = ["numpy", "torch", "triton"]
missing = [m for m in need if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"missing {', '.join(missing)}: the probe needs numpy, torch and triton")
import numpy, torch, triton
print(f"python {sys.version.split()[0]}, numpy {numpy.__version__}, torch {torch.__version__} "
      f"(cuda {torch.version.cuda}), triton {triton.__version__}")
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(f"device: {p.name}, {p.total_memory / 2**30:.0f} GiB, "
          f"L2 {getattr(p, 'L2_cache_size', 0) / 2**20:.0f} MiB, {p.multi_processor_count} SMs")
opt = [m for m in ("flashinfer", "matplotlib", "typer", "rich", "xxhash")
       if importlib.util.find_spec(m) is None]
print("optional, absent:", ", ".join(opt) or "none")
PYEOF
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv || true

if [[ "${PROBE_DRY_RUN:-0}" == "1" ]]; then
  ARGS=(--device cpu --grid smoke --model tiny-llama --kernel triton-paged --reps 1 --warmup 0)
  export TRITON_INTERPRET=1
  DEV=cpu
else
  ARGS=(--device cuda)
  DEV=cuda
fi
# The Triton kernel against the torch reference on this device (fp32 and bf16), before timing.
timeout 180 "$PY" -m feather_lab.probe.selfcheck --device "$DEV" | tee "$DEST/selfcheck.json" \
  || echo "== SELFCHECK FAILED (see selfcheck.json): timing the kernel anyway"
LEFT=$((450 - (SECONDS - START)))
((BUDGET > LEFT - 90)) && BUDGET=$((LEFT - 90))  # leave time for the last composition and the fit
timeout "$LEFT" "$PY" -m feather_lab.probe "${ARGS[@]}" --budget-s "$BUDGET" \
  --out "$DEST/PROFILE.json" --json "$DEST/RESULTS.json" --plot "$DEST/plot.png" \
  || { echo "== probe failed (rc $?): what it measured is in $DEST/RESULTS.json.partial"; exit 1; }
echo "== probe done after $((SECONDS - START)) s"

# The simulator's suite on the measured profile is a CPU job (minutes): by default it is left
# for afterwards on any machine, so the GPU lease is not spent on it; PROBE_BENCH=1 runs it here
# when the CLI's dependencies import and enough of the 8 minutes is left.
if [[ "${PROBE_BENCH:-0}" == "1" ]] && "$PY" -c "import typer, rich, xxhash, matplotlib" 2>/dev/null \
  && ((SECONDS - START < 330)); then
  timeout $((450 - (SECONDS - START))) "$PY" -m feather_lab.cli bench \
    --hardware "$DEST/PROFILE.json" --json "$DEST/bench.json" --plot "$DEST/bench.png" \
    || echo "bench did not finish here: run it afterwards (see the header)"
else
  echo "bench not run here: feather bench --hardware $DEST/PROFILE.json (on any machine)"
fi
echo "== done after $((SECONDS - START)) s: $(ls "$DEST" | tr '\n' ' ')"
