#!/usr/bin/env bash
# GPU smoke test: on a host with one NVIDIA card, a Run booked one GPU sees
# exactly that card through the whole path — warmfleet-gpu-probe's facts,
# the host's CDI spec, the control plane's booking, the agent's launch
# through containerd with the card injected by CDI — and `nvidia-smi -L`
# inside the container lists the booked UUID and nothing else.
#
# It assumes nothing is installed but the driver (e.g. the lent H200 VM:
# driver under /usr/local/nvidia, no containerd, runc or nvidia-ctk, no
# network). Carried programs are named by environment variables:
#
#   WF_BIN          dir holding warmfleet, warmfleet-agent and
#                   warmfleet-gpu-probe (default: bin, from `make build`)
#   CONTAINERD_BIN  dir holding containerd, containerd-shim-runc-v2 and runc
#                   (default: found on PATH)
#   NVIDIA_CTK      nvidia-ctk (default: on PATH)
#   NVIDIA_CDI_HOOK nvidia-cdi-hook, which the generated spec's hooks run
#                   (default: next to nvidia-ctk, else on PATH)
#   NVIDIA_SMI      the host's nvidia-smi, whose libraries (glibc) go into
#                   the Run's image (default: on PATH, else
#                   /usr/local/nvidia/bin/nvidia-smi)
#   ADAPTER_TEST    optional: a test binary of adapters/containerd
#                   (`go test -c ./adapters/containerd`); when set, its
#                   TestRealGPU_NvidiaSmiSeesTheInjectedCard runs too
#   WORK            work dir (default: a new /tmp/wfgpu.XXXXXX, removed
#                   at exit unless KEEP=1)
#   PORT            the embedded NATS port (default 14222)
#   DRY_RUN=1       for a machine without a GPU: check the inputs, start
#                   containerd, the control plane and an agent, and check
#                   its facts say it looked and found no driver; no CDI
#                   spec, no Run
#
# The Run's image is /bin/sh plus the host's glibc (`warmfleet dev
# host-image`): nvidia-smi is mounted from the host by the CDI spec and
# needs glibc, which a busybox-static image lacks.
#
# Each check prints one PASS or FAIL line; the script exits non-zero at the
# first FAIL, after printing the logs that explain it.
set -euo pipefail
cd "$(dirname "$0")/.."

WF_BIN=${WF_BIN:-bin}
WF_BIN=$(cd "$WF_BIN" && pwd)
PORT=${PORT:-14222}
DRY_RUN=${DRY_RUN:-0}
KEEP=${KEEP:-0}
NATS_URL=nats://127.0.0.1:$PORT
NODE=gpu-smoke-1

pids=()
WORK=${WORK:-}
made_work=0
if [ -z "$WORK" ]; then
	WORK=$(mktemp -d /tmp/wfgpu.XXXXXX) # short: containerd's socket path must stay under 108 bytes
	made_work=1
fi
mkdir -p "$WORK"

cleanup() {
	local i
	for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
		kill "${pids[i]}" 2>/dev/null || true
		wait "${pids[i]}" 2>/dev/null || true
	done
	if [ "$KEEP" != 1 ] && [ "$made_work" = 1 ]; then
		rm -rf "$WORK" 2>/dev/null || echo "note: could not remove all of $WORK (mounts left by containers?)"
	else
		echo "work dir kept: $WORK"
	fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

pass() { echo "PASS: $*"; }
note() { echo "NOTE: $*"; }
fail() {
	echo "FAIL: $*"
	local f
	for f in "$WORK"/containerd.log "$WORK"/serve.log "$WORK"/agent.log; do
		if [ -s "$f" ]; then
			echo "---- last lines of $f"
			tail -n 40 "$f"
		fi
	done
	exit 1
}

# wait_for runs "$@" every 0.2 s until it succeeds or $TRIES (default 150)
# tries have failed.
wait_for() {
	local i
	for ((i = 0; i < ${TRIES:-150}; i++)); do
		if "$@" >/dev/null 2>&1; then
			return 0
		fi
		sleep 0.2
	done
	return 1
}

wf() { "$WF_BIN/warmfleet" --nats-url "$NATS_URL" --log-level warn "$@"; }

# ---- inputs
for b in warmfleet warmfleet-agent warmfleet-gpu-probe; do
	[ -x "$WF_BIN/$b" ] || fail "no $WF_BIN/$b (make build, or set WF_BIN)"
done
if [ -n "${CONTAINERD_BIN:-}" ]; then
	PATH=$(cd "$CONTAINERD_BIN" && pwd):$PATH
	export PATH
fi
for b in containerd containerd-shim-runc-v2 runc; do
	command -v "$b" >/dev/null || fail "no $b on PATH (set CONTAINERD_BIN to the dir holding containerd, containerd-shim-runc-v2 and runc)"
done
[ "$(id -u)" = 0 ] || fail "containerd needs root"
pass "inputs: $WF_BIN, $(command -v containerd) ($(containerd --version | awk '{print $3}'))"

# The driver's libraries may live outside the loader's search path (the
# lent VM keeps them in /usr/local/nvidia/lib64): NVML's users need them.
NVML_LIBRARY=${NVML_LIBRARY:-}
if [ -z "$NVML_LIBRARY" ] && ! ldconfig -p 2>/dev/null | grep -q 'libnvidia-ml\.so\.1 '; then
	for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu; do
		if [ -e "$d/libnvidia-ml.so.1" ]; then
			NVML_LIBRARY=$d/libnvidia-ml.so.1
			LD_LIBRARY_PATH=$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
			export LD_LIBRARY_PATH
			break
		fi
	done
fi
probe_args=(--xid-window=200ms)
agent_args=()
if [ -n "$NVML_LIBRARY" ]; then
	probe_args+=("--nvml-library=$NVML_LIBRARY")
	agent_args+=("--nvml-library=$NVML_LIBRARY")
fi

# ---- 1. the probe names the card
facts=$("$WF_BIN/warmfleet-gpu-probe" "${probe_args[@]}" --log-level info 2>"$WORK/probe.log") || fail "warmfleet-gpu-probe exited $?: $(cat "$WORK/probe.log")"
echo "probe: $facts"
UUID=""
if [ "$DRY_RUN" = 1 ]; then
	case "$facts" in
	'{"established":true}') pass "probe: looked and found no driver (dry run)" ;;
	*'"vendor":"nvidia"'*) note "dry run on a host with a driver" ;;
	*) fail "probe could not look: $facts" ;;
	esac
else
	case "$facts" in
	*'"vendor":"nvidia"'*) ;;
	*) fail "probe found no NVIDIA driver: $facts" ;;
	esac
	mapfile -t uuids < <(grep -o '"uuid":"GPU-[^"]*"' <<<"$facts" | cut -d'"' -f4)
	[ "${#uuids[@]}" = 1 ] || fail "probe lists ${#uuids[@]} cards with a UUID, want exactly 1: $facts"
	UUID=${uuids[0]}
	grep -q '"health":"ok"' <<<"$facts" || fail "the card is not healthy: $facts"
	pass "probe: one healthy card $UUID"
fi

# ---- 2. the CDI spec for it
CDI_DIR=$WORK/cdi
mkdir -p "$CDI_DIR"
NVIDIA_SMI=${NVIDIA_SMI:-$(command -v nvidia-smi || echo /usr/local/nvidia/bin/nvidia-smi)}
if [ "$DRY_RUN" != 1 ]; then
	NVIDIA_CTK=${NVIDIA_CTK:-$(command -v nvidia-ctk || true)}
	[ -x "$NVIDIA_CTK" ] || fail "no nvidia-ctk (set NVIDIA_CTK)"
	NVIDIA_CDI_HOOK=${NVIDIA_CDI_HOOK:-$(dirname "$NVIDIA_CTK")/nvidia-cdi-hook}
	[ -x "$NVIDIA_CDI_HOOK" ] || NVIDIA_CDI_HOOK=$(command -v nvidia-cdi-hook || true)
	[ -x "$NVIDIA_CDI_HOOK" ] || fail "no nvidia-cdi-hook (set NVIDIA_CDI_HOOK): the spec's hooks run it"
	NVIDIA_CDI_HOOK=$(cd "$(dirname "$NVIDIA_CDI_HOOK")" && pwd)/$(basename "$NVIDIA_CDI_HOOK")
	"$NVIDIA_CTK" cdi generate --output="$CDI_DIR/nvidia.yaml" --nvidia-cdi-hook-path="$NVIDIA_CDI_HOOK" >"$WORK/nvidia-ctk.log" 2>&1 ||
		fail "nvidia-ctk cdi generate: $(tail -n 20 "$WORK/nvidia-ctk.log")"
	grep -q "name: $UUID" "$CDI_DIR/nvidia.yaml" || fail "the CDI spec does not declare nvidia.com/gpu=$UUID"
	pass "CDI spec $CDI_DIR/nvidia.yaml declares nvidia.com/gpu=0 and nvidia.com/gpu=$UUID ($(grep -c 'hostPath:' "$CDI_DIR/nvidia.yaml") host paths)"
	[ -x "$NVIDIA_SMI" ] || fail "no nvidia-smi on the host (set NVIDIA_SMI)"
fi

# ---- 3. the adapter alone gives a container the card (optional)
if [ -n "${ADAPTER_TEST:-}" ] && [ "$DRY_RUN" != 1 ]; then
	if WARMFLEET_GPU_CDI_DIR=$CDI_DIR WARMFLEET_GPU_UUID=$UUID WARMFLEET_GPU_NVIDIA_SMI=$NVIDIA_SMI \
		"$ADAPTER_TEST" -test.run '^TestRealGPU_' -test.v -test.timeout 5m >"$WORK/adapter-test.log" 2>&1; then
		pass "adapters/containerd: nvidia-smi -L sees exactly $UUID when given it by UUID or by index, and no card when given none"
	else
		tail -n 60 "$WORK/adapter-test.log"
		fail "adapters/containerd TestRealGPU (log above)"
	fi
fi

# ---- 4. containerd of our own
CTRD=$WORK/ctrd
mkdir -p "$CTRD/root" "$CTRD/state"
cat >"$CTRD/config.toml" <<TOML
version = 2
root = "$CTRD/root"
state = "$CTRD/state"
disabled_plugins = [
  "io.containerd.grpc.v1.cri",
  "io.containerd.internal.v1.opt",
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper",
]
[grpc]
  address = "$CTRD/c.sock"
TOML
containerd --config "$CTRD/config.toml" >"$WORK/containerd.log" 2>&1 &
pids+=($!)
wait_for test -S "$CTRD/c.sock" || fail "containerd did not open $CTRD/c.sock"
pass "containerd at $CTRD/c.sock"

# ---- 5. the Run's image: /bin/sh and the host's glibc (with nvidia-smi's
# libraries; nvidia-smi itself is mounted by the CDI spec)
programs=()
[ -x "$NVIDIA_SMI" ] && programs+=(--program "$NVIDIA_SMI")
IMAGE=$("$WF_BIN/warmfleet" dev host-image --dir "$WORK/images" --name gpu-smoke "${programs[@]}") || fail "building the host-glibc image"
pass "image $IMAGE"

# ---- 6. control plane and agent
"$WF_BIN/warmfleet" serve --data-dir "$WORK/cp" --port "$PORT" >"$WORK/serve.log" 2>&1 &
pids+=($!)
wait_for wf node list || fail "warmfleet serve did not answer at $NATS_URL"
wf node invite --node "$NODE" --out "$WORK/bootstrap.json" >/dev/null || fail "node invite"
"$WF_BIN/warmfleet-agent" --nats-url "$NATS_URL" --bootstrap "$WORK/bootstrap.json" --data-dir "$WORK/agent" \
	--containerd-address "$CTRD/c.sock" --content-root "$CTRD/root" --image-dir "$WORK/images" \
	--cdi-spec-dir "$CDI_DIR" --gpu-probe "$WF_BIN/warmfleet-gpu-probe" "${agent_args[@]}" \
	--facts-interval 5s --log-level debug >"$WORK/agent.log" 2>&1 &
pids+=($!)
enrolled() { wf node list | grep -q "^$NODE "; }
wait_for enrolled || fail "agent $NODE did not enroll"
pass "agent $NODE enrolled"

# ---- 7. its facts name the card and its CDI names
# The CLI indents its JSON; checks read it without whitespace.
node_json() { wf -o json node list | tr -d ' \t\n'; }
looked() { node_json | grep -q '"accelerator":{"established":true'; }
if [ "$DRY_RUN" = 1 ]; then
	TRIES=50 wait_for looked || fail "facts do not say the agent looked for GPUs: $(node_json)"
	pass "facts: accelerator established (dry run: $(node_json | grep -o '"accelerator":{[^}]*}' | head -n 1))"
	echo "DRY RUN: stopping before the Run (no GPU here)"
	exit 0
fi
has_cdi_names() { node_json | grep -q "\"cdi_devices\":\[\"nvidia.com/gpu=$UUID\",\"nvidia.com/gpu=0\"\]"; }
TRIES=100 wait_for has_cdi_names || fail "facts do not give card $UUID its CDI names: $(node_json)"
pass "facts: card 0 $UUID offered as nvidia.com/gpu=$UUID and nvidia.com/gpu=0"

# ---- 8. a Run booked one GPU. It writes what nvidia-smi says into a cache
# directory, which the node keeps (<agent data dir>/caches), and prints it,
# which run logs reads back (step 10). It asks
# for no network: the lent VM has no CNI plugins, so its node offers none.
smi=$(grep -A1 "hostPath: .*/nvidia-smi$" "$CDI_DIR/nvidia.yaml" | grep -o 'containerPath: .*' | awk '{print $2}' | head -n 1)
smi=${smi:-nvidia-smi}
cat >"$WORK/run.json" <<JSON
{
  "request_id": "gpu-smoke-$(date +%s)",
  "image": "$IMAGE",
  "command": ["/bin/sh", "-c", "$smi -L >/out/nvidia-smi.txt 2>&1; code=\$?; cat /out/nvidia-smi.txt; exit \$code"],
  "env": {"PATH": "/usr/local/nvidia/bin:/usr/local/bin:/usr/bin:/bin", "LD_LIBRARY_PATH": "/usr/local/nvidia/lib64:/usr/lib/x86_64-linux-gnu"},
  "resources": {"gpu_count": 1},
  "network": "none",
  "caches": [{"name": "gpu-smoke", "compatibility_key": "v1", "path": "/out"}],
  "max_runtime_seconds": 120
}
JSON
submitted=$(wf run submit -f "$WORK/run.json") || fail "run submit: $(cat "$WORK/run.json")"
RUN=$(awk '{print $NF}' <<<"$submitted")
echo "submitted run $RUN ($smi -L)"
run_json() { wf -o json run get "$RUN" | tr -d ' \t\n'; }
phase() { run_json | grep -o '"phase":"[a-z]*"' | head -n 1 | cut -d'"' -f4; }
ended() { case "$(phase)" in succeeded | failed | cancelled | lost) return 0 ;; esac; return 1; }
TRIES=900 wait_for ended || fail "run $RUN did not end within 3 minutes (phase $(phase))"
wf -o json run get "$RUN" || true
wf run events "$RUN" || true
if [ "$(phase)" != succeeded ]; then
	cat "$WORK/agent/caches/gpu-smoke/v1/nvidia-smi.txt" 2>/dev/null || true
	fail "run $RUN ended $(phase)"
fi
pass "run $RUN succeeded"

# ---- 9. it saw exactly the booked card
booked=$(run_json | grep -o '"gpus":\[[^]]*\]' | head -n 1 || true)
want=$UUID
if [ -n "$booked" ]; then
	[ "$booked" = "\"gpus\":[\"$UUID\"]" ] || fail "run $RUN booked $booked, want the one card [$UUID]"
	pass "booking records gpus [$UUID]"
else
	note "run $RUN records no gpus in its booking (the control plane's card booking has not landed); comparing with the probe's UUID"
fi
out=$(cat "$WORK/agent/caches/gpu-smoke/v1/nvidia-smi.txt" 2>/dev/null || true)
echo "container output:"
echo "$out"
lines=$(grep -c '^GPU [0-9]*:' <<<"$out" || true)
[ "$lines" = 1 ] || fail "nvidia-smi -L listed $lines cards, want exactly 1"
grep -q "(UUID: $want)" <<<"$out" || fail "nvidia-smi -L did not list $want"
pass "nvidia-smi -L in the Run's container lists exactly $want"

# ---- 10. the Run's output, kept by the shim's log writer (the agent's
# binary) and shipped to WF_LOGS before the exit was reported
logs=$(wf run logs "$RUN") || fail "run logs $RUN"
[ "$logs" = "$out" ] || fail "run logs printed '$logs', the container wrote '$out'"
pass "run logs $RUN prints what the container wrote"
echo "GPU SMOKE: PASS"
