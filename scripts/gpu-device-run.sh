#!/usr/bin/env bash
# gpu-device-run.sh unpacks the xz-compressed programs a device call carries
# in .gpu/ (containerd, containerd-shim-runc-v2, runc, nvidia-ctk,
# nvidia-cdi-hook, warmfleet, warmfleet-agent, warmfleet-gpu-probe) and runs
# scripts/gpu-smoke.sh with them, teeing its output to $OUT/smoke.log when
# OUT is set. For hosts where nothing but the driver is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
carry=${CARRY:-.gpu}
bin=$(mktemp -d /tmp/wfcarry.XXXXXX)
for f in "$carry"/*.xz; do
	xz -dc "$f" >"$bin/$(basename "$f" .xz)"
done
chmod +x "$bin"/*
export WF_BIN=$bin CONTAINERD_BIN=$bin NVIDIA_CTK=$bin/nvidia-ctk NVIDIA_CDI_HOOK=$bin/nvidia-cdi-hook
if [ -n "${OUT:-}" ]; then
	bash scripts/gpu-smoke.sh 2>&1 | tee "$OUT/smoke.log"
else
	bash scripts/gpu-smoke.sh
fi
