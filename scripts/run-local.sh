#!/usr/bin/env bash
# make run: the control plane with its embedded NATS, a containerd (the
# system one, or a private one under the data dir), and one local agent
# enrolled by invitation. Ctrl-C stops what this script started.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${DATA:-.warmfleet}
NATS_URL=nats://127.0.0.1:${PORT:-4222}
mkdir -p "$DATA"
DATA=$(cd "$DATA" && pwd) # absolute: containerd's config needs it
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT INT TERM

CTRD=/run/containerd/containerd.sock
if ! ctr -a "$CTRD" version >/dev/null 2>&1; then
	# No system containerd answering: start a private one. Socket paths must
	# be short, so it lives under /run.
	CTRD_DIR=/run/warmfleet-containerd
	mkdir -p "$CTRD_DIR" "$DATA/containerd"
	cat >"$CTRD_DIR/config.toml" <<TOML
version = 2
root = "$DATA/containerd/root"
state = "$CTRD_DIR/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$CTRD_DIR/containerd.sock"
TOML
	CTRD=$CTRD_DIR/containerd.sock
	containerd --config "$CTRD_DIR/config.toml" >"$DATA/containerd.log" 2>&1 &
	pids+=($!)
	for _ in $(seq 50); do ctr -a "$CTRD" version >/dev/null 2>&1 && break; sleep 0.1; done
	echo "started a private containerd at $CTRD (log: $DATA/containerd.log)"
fi

IMAGE=$(bin/warmfleet dev busybox-image --dir "$DATA/images")

bin/warmfleet serve --data-dir "$DATA" --port "${PORT:-4222}" >"$DATA/serve.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do bin/warmfleet --nats-url "$NATS_URL" node list >/dev/null 2>&1 && break; sleep 0.1; done

# A fresh invitation each start: the agent resumes its saved session when it
# still holds, and enrolls with this token when it does not.
bin/warmfleet --nats-url "$NATS_URL" node invite --node local-1 --out "$DATA/local-1.bootstrap.json" >/dev/null
bin/warmfleet-agent --nats-url "$NATS_URL" --bootstrap "$DATA/local-1.bootstrap.json" --data-dir "$DATA/agent" \
	--containerd-address "$CTRD" --image-dir "$DATA/images" >"$DATA/agent.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do bin/warmfleet --nats-url "$NATS_URL" node list 2>/dev/null | grep -q local-1 && break; sleep 0.1; done

cat <<MSG

warmfleet is running: control plane + embedded NATS at $NATS_URL, agent local-1.
Logs: $DATA/serve.log, $DATA/agent.log

Try:
  bin/warmfleet run submit --image $IMAGE --wait -- sh -c 'echo hello from warmfleet; exit 3'
  nats -s $NATS_URL pub wf.runs.submit '{"request_id":"hello-1","image":"$IMAGE","command":["sh","-c","echo hi"]}'
  bin/warmfleet run list
  bin/warmfleet node list

Ctrl-C to stop.
MSG
wait -n "${pids[@]}"
