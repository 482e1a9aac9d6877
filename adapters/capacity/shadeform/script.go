package shadeform

import (
	"encoding/base64"
	"encoding/json"
	"strings"

	"github.com/warmfleet/warmfleet/schemas"
)

// BootstrapPath is where the startup script installs the node bootstrap.
const BootstrapPath = "/etc/warmfleet/bootstrap.json"

// scriptDelimiter ends the here-document holding the bootstrap. It cannot
// occur in base64 text, so no bootstrap content can end it early.
const scriptDelimiter = "WARMFLEET_BOOTSTRAP_B64"

// The bootstrap travels base64-encoded inside a quoted here-document, so
// the shell never interprets a byte of it: quotes, $, backticks and
// newlines in its fields arrive as they left. WARMFLEET_ROOT (unset on a
// real machine) relocates the files so tests can run the script.
const scriptHead = `#!/bin/bash
# Written by warmfleet's shadeform adapter: install this machine's node
# bootstrap and start the node agent. The bootstrap holds a single-use
# enrollment token, so it is written 0600 and never echoed.
set -euo pipefail
umask 077
root="${WARMFLEET_ROOT:-}"
dir="$root/etc/warmfleet"
install -d -m 0700 "$dir"
tmp="$(mktemp "$dir/.bootstrap.XXXXXX")"
base64 -d > "$tmp" <<'` + scriptDelimiter + `'
`

const scriptTail = scriptDelimiter + `
chmod 0600 "$tmp"
mv -f "$tmp" "$dir/bootstrap.json"
[ -z "$root" ] || exit 0
if command -v systemctl >/dev/null 2>&1 && systemctl cat warmfleet-agent.service >/dev/null 2>&1; then
  systemctl enable --now warmfleet-agent.service
elif command -v warmfleet-agent >/dev/null 2>&1; then
  nohup warmfleet-agent --bootstrap "$dir/bootstrap.json" >>/var/log/warmfleet-agent.log 2>&1 &
else
  echo "warmfleet: no warmfleet-agent on this image; bootstrap left at $dir/bootstrap.json" >&2
  exit 1
fi
`

// startupScript is the bash script that delivers b to the machine: its JSON
// encoding, byte for byte, at BootstrapPath.
func startupScript(b schemas.NodeBootstrap) (string, error) {
	payload, err := json.Marshal(b)
	if err != nil {
		return "", err
	}
	enc := base64.StdEncoding.EncodeToString(payload)
	var s strings.Builder
	s.WriteString(scriptHead)
	for len(enc) > 76 {
		s.WriteString(enc[:76])
		s.WriteByte('\n')
		enc = enc[76:]
	}
	s.WriteString(enc)
	s.WriteByte('\n')
	s.WriteString(scriptTail)
	return s.String(), nil
}
