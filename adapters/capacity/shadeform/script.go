package shadeform

import (
	"github.com/warmfleet/warmfleet/adapters/capacity/cloudinit"
	"github.com/warmfleet/warmfleet/schemas"
)

// BootstrapPath is where the startup script installs the node bootstrap.
const BootstrapPath = cloudinit.BootstrapPath

// scriptOptions: Shadeform images are expected to carry the agent (its
// systemd unit, or the binary on PATH); the script only delivers the
// bootstrap and starts it.
var scriptOptions = cloudinit.Options{AgentPreinstalled: true}

// startupScript is the bash script that delivers b to the machine: its JSON
// encoding, byte for byte, at BootstrapPath. Shadeform's launch
// configuration takes a script, not cloud-init user data; both come from
// the cloudinit package.
func startupScript(b schemas.NodeBootstrap) (string, error) {
	return cloudinit.Script(b, scriptOptions)
}
