package cloudinit

import (
	"encoding/base64"
	"encoding/json"
	"strings"

	"github.com/warmfleet/warmfleet/schemas"
)

// The shell both deliveries run. WARMFLEET_ROOT (unset on a real machine)
// relocates every file so tests can run it; with it set nothing is started.

// prelude: strict bash, private files, and the bootstrap's directory (0700).
const prelude = `set -euo pipefail
umask 077
root="${WARMFLEET_ROOT:-}"
dir="$root/etc/warmfleet"
install -d -m 0700 "$dir"
`

// bootstrapDelimiter ends the here-document holding the bootstrap. It
// cannot occur in base64 text, so no bootstrap content can end it early.
const bootstrapDelimiter = "WARMFLEET_BOOTSTRAP_B64"

// The bootstrap travels base64-encoded inside a quoted here-document, so the
// shell never interprets a byte of it: quotes, $, backticks and newlines in
// its fields arrive as they left.
const bootstrapHead = `tmp="$(mktemp "$dir/.bootstrap.XXXXXX")"
base64 -d > "$tmp" <<'` + bootstrapDelimiter + `'
`

const bootstrapTail = bootstrapDelimiter + `
chmod 0600 "$tmp"
mv -f "$tmp" "$dir/bootstrap.json"
`

// fetchAgent downloads the agent next to its final place, checks it against
// the pinned sha256 and only then moves it into place; on a mismatch the
// script stops before anything is started. agent_url and agent_sha256 are
// set by the lines before it.
const fetchAgent = `bin="$root/usr/local/bin"
install -d -m 0755 "$bin"
agent_tmp="$(mktemp "$bin/.warmfleet-agent.XXXXXX")"
trap 'rm -f "$agent_tmp"' EXIT
curl --fail --silent --show-error --location --retry 5 --retry-delay 2 --output "$agent_tmp" "$agent_url"
if ! printf '%s  %s\n' "$agent_sha256" "$agent_tmp" | sha256sum -c --status -; then
  echo "warmfleet: the downloaded agent does not match agent_sha256; not installing or starting it" >&2
  exit 1
fi
chmod 0755 "$agent_tmp"
mv -f "$agent_tmp" "$bin/warmfleet-agent"
`

// generateCDI writes the CDI spec for this host's NVIDIA cards when the
// NVIDIA container toolkit is installed: the agent gives containers their
// GPUs through it (adapters/cdispec reads /var/run/cdi). A failure is said
// and does not stop the agent: its facts then list cards without CDI names,
// and the host takes no GPU Run. The agent's unit regenerates it at each
// start (deploy/systemd/warmfleet-agent.service), since /var/run is emptied
// by a reboot.
const generateCDI = `if command -v nvidia-ctk >/dev/null 2>&1; then
  install -d -m 0755 "$root/var/run/cdi"
  if ! nvidia-ctk cdi generate --output="$root/var/run/cdi/nvidia.yaml"; then
    echo "warmfleet: nvidia-ctk cdi generate failed; this host's GPUs cannot be given to Runs" >&2
  fi
fi
`

// startAgent starts the agent: through its systemd unit when there is one,
// else straight from PATH.
const startAgent = `[ -z "$root" ] || exit 0
if command -v systemctl >/dev/null 2>&1; then systemctl daemon-reload || true; fi
if command -v systemctl >/dev/null 2>&1 && systemctl cat warmfleet-agent.service >/dev/null 2>&1; then
  systemctl enable --now warmfleet-agent.service
elif command -v warmfleet-agent >/dev/null 2>&1; then
  nohup warmfleet-agent --nats-auth --bootstrap "$dir/bootstrap.json" >>/var/log/warmfleet-agent.log 2>&1 &
else
  echo "warmfleet: no warmfleet-agent on this image; bootstrap left at $dir/bootstrap.json" >&2
  exit 1
fi
`

// bootstrapPayload is b as the agent reads it: its JSON encoding.
func bootstrapPayload(b schemas.NodeBootstrap) ([]byte, error) {
	return json.Marshal(b)
}

// agentSteps is the shell that installs (unless preinstalled) and starts
// the agent; o is valid.
func agentSteps(o Options) string {
	var s strings.Builder
	s.WriteString(prelude)
	if !o.AgentPreinstalled {
		s.WriteString("agent_url=" + shellQuote(o.AgentURL) + "\n")
		s.WriteString("agent_sha256=" + strings.ToLower(o.AgentSHA256) + "\n")
		s.WriteString(fetchAgent)
	}
	s.WriteString(generateCDI)
	s.WriteString(startAgent)
	return s.String()
}

// Script is a bash startup script for providers that run one at first boot:
// it writes b's JSON encoding, byte for byte, at BootstrapPath (0600, in a
// 0700 directory), installs the agent as o says and starts it. The bootstrap
// is delivered as given; callers that mint it validate it.
func Script(b schemas.NodeBootstrap, o Options) (string, error) {
	if err := o.Validate(); err != nil {
		return "", err
	}
	payload, err := bootstrapPayload(b)
	if err != nil {
		return "", err
	}
	var s strings.Builder
	s.WriteString("#!/bin/bash\n")
	s.WriteString("# Written by warmfleet: install this machine's node bootstrap and start the\n")
	s.WriteString("# node agent. The bootstrap holds a single-use enrollment token, so it is\n")
	s.WriteString("# written 0600 and never echoed.\n")
	steps := agentSteps(o)
	// The bootstrap goes right after the prelude, before anything can fail.
	s.WriteString(prelude)
	s.WriteString(bootstrapHead)
	enc := base64.StdEncoding.EncodeToString(payload)
	for len(enc) > 76 {
		s.WriteString(enc[:76])
		s.WriteByte('\n')
		enc = enc[76:]
	}
	s.WriteString(enc)
	s.WriteByte('\n')
	s.WriteString(bootstrapTail)
	s.WriteString(strings.TrimPrefix(steps, prelude))
	return s.String(), nil
}

// shellQuote quotes s as one bash word.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
