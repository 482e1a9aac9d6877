#!/usr/bin/env bash
# make run: the control plane with its embedded NATS (auth and TLS on), a
# containerd (the system one, or a private one under the data dir), and one
# local agent enrolled by invitation. Ctrl-C stops what this script started.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${DATA:-.warmfleet}
mkdir -p "$DATA"
DATA=$(cd "$DATA" && pwd) # absolute: containerd's config needs it
if [ "$DATA" != "$PWD/.warmfleet" ]; then
	# The CLI finds serve's operator login in ./.warmfleet by itself; a
	# data dir elsewhere is named through the environment instead.
	export WARMFLEET_NATS_URL=tls://127.0.0.1:${PORT:-4222} WARMFLEET_NATS_TOKEN_FILE=$DATA/operator.token WARMFLEET_NATS_CA=$DATA/tls/ca.pem
fi
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

# --auth: every client logs in, over TLS from the CA serve keeps in
# $DATA/tls; serve writes the operator's login to $DATA/operator.json (0600),
# which the CLI below finds on its own.
bin/warmfleet serve --auth --data-dir "$DATA" --port "${PORT:-4222}" >"$DATA/serve.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do bin/warmfleet node list >/dev/null 2>&1 && break; sleep 0.1; done

# A fresh invitation each start: the agent resumes its saved session when it
# still holds, and enrolls with this token when it does not. The bootstrap
# carries the server's URL and CA, so the agent logs in over TLS.
bin/warmfleet node invite --node local-1 --out "$DATA/local-1.bootstrap.json" >/dev/null
bin/warmfleet-agent --nats-auth --bootstrap "$DATA/local-1.bootstrap.json" --data-dir "$DATA/agent" \
	--containerd-address "$CTRD" --image-dir "$DATA/images" >"$DATA/agent.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do bin/warmfleet node list 2>/dev/null | grep -q local-1 && break; sleep 0.1; done

cat <<MSG

warmfleet is running: control plane + embedded NATS at tls://127.0.0.1:${PORT:-4222} (auth on), agent local-1.
Logs: $DATA/serve.log, $DATA/agent.log

Try:
  bin/warmfleet run submit --image $IMAGE --wait -- sh -c 'echo hello from warmfleet; exit 3'
  export NATS_CONTEXT=$DATA/operator.json   # the stock nats CLI's login
  nats pub wf.runs.default.operator.submit '{"request_id":"hello-1","image":"$IMAGE","command":["sh","-c","echo hi"]}'
  bin/warmfleet run list
  bin/warmfleet node list

Ctrl-C to stop.
MSG
wait -n "${pids[@]}"
