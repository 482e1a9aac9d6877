// Package cloudinit turns a node bootstrap into what a rented machine runs
// at first boot: a #cloud-config user-data document (Render) for providers
// that take cloud-init, or a bash script (Script) for providers that take a
// startup script. Both install the bootstrap at BootstrapPath (0600, root),
// put the node agent in place (downloaded and checked against a pinned
// sha256, or already on the image) and start it. The bootstrap holds a
// single-use enrollment token: it travels base64-encoded as file content,
// never on a command line, and nothing here prints it.
package cloudinit

//go:generate go test -run TestExampleUserDataIsCurrent -update

import (
	"fmt"
	"net/url"
	"regexp"
	"strings"

	"github.com/warmfleet/warmfleet/schemas"
)

// Where things go on the machine.
const (
	// BootstrapPath is the node bootstrap (warmfleet-agent --bootstrap).
	BootstrapPath = "/etc/warmfleet/bootstrap.json"
	// AgentPath is where the agent binary is installed; the systemd unit runs it.
	AgentPath = "/usr/local/bin/warmfleet-agent"
	// UnitPath is the agent's systemd unit (deploy/systemd/warmfleet-agent.service).
	UnitPath = "/etc/systemd/system/warmfleet-agent.service"
)

// Limits on operator input.
const (
	MaxURLLength = 2048
	MaxPackages  = 64
)

// Options say how the agent gets onto the machine and what else to install.
// Exactly one of AgentURL (with AgentSHA256) and AgentPreinstalled is set.
type Options struct {
	// AgentURL is an http(s) URL of the warmfleet-agent binary. It must not
	// carry credentials in its user-info part.
	AgentURL string `json:"agent_url,omitempty"`
	// AgentSHA256 is the binary's sha256 (64 hex digits). The machine refuses
	// to install or start an agent that does not match it.
	AgentSHA256 string `json:"agent_sha256,omitempty"`
	// AgentPreinstalled says the image already has the agent at AgentPath.
	AgentPreinstalled bool `json:"agent_preinstalled,omitempty"`
	// InstallContainerd installs Debian/Ubuntu's containerd and runc.
	InstallContainerd bool `json:"install_containerd,omitempty"`
	// NVIDIAContainerToolkit installs nvidia-container-toolkit; the image
	// must already have NVIDIA's apt repository (GPU images usually do).
	NVIDIAContainerToolkit bool `json:"nvidia_container_toolkit,omitempty"`
	// Packages are extra apt packages: a name, or name=version.
	Packages []string `json:"packages,omitempty"`
}

var (
	sha256Hex      = regexp.MustCompile(`^[0-9a-fA-F]{64}$`)
	aptPackage     = regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]{0,127}(=[A-Za-z0-9.+~:-]{1,128})?$`)
	printableASCII = regexp.MustCompile(`^[\x21-\x7e]+$`)
)

// refuse builds the coded refusal every validation failure here returns.
// Reasons never repeat the offending value: it may be a secret.
func refuse(code schemas.Code, field, format string, args ...any) error {
	return &schemas.Refusal{Code: code, Field: field, Reason: fmt.Sprintf(format, args...)}
}

// Validate checks o. Failures are *schemas.Refusal naming the field.
func (o Options) Validate() error {
	switch {
	case o.AgentPreinstalled && o.AgentURL != "":
		return refuse(schemas.CodeMalformed, "agent_url", "set agent_url (with agent_sha256) or agent_preinstalled, not both")
	case o.AgentPreinstalled && o.AgentSHA256 != "":
		return refuse(schemas.CodeMalformed, "agent_sha256", "agent_preinstalled downloads nothing to check; leave agent_sha256 empty")
	case !o.AgentPreinstalled && o.AgentURL == "":
		return refuse(schemas.CodeMissingField, "agent_url", "set agent_url and agent_sha256, or agent_preinstalled when the image has %s", AgentPath)
	}
	if !o.AgentPreinstalled {
		if err := validateAgentURL(o.AgentURL); err != nil {
			return err
		}
		if o.AgentSHA256 == "" {
			return refuse(schemas.CodeMissingField, "agent_sha256", "the agent download must be pinned by its sha256 (64 hex digits)")
		}
		if !sha256Hex.MatchString(o.AgentSHA256) {
			return refuse(schemas.CodeInvalidDigest, "agent_sha256", "must be 64 hex digits (the output of sha256sum)")
		}
	}
	if len(o.Packages) > MaxPackages {
		return refuse(schemas.CodeTooManyItems, "packages", "at most %d packages", MaxPackages)
	}
	for i, p := range o.Packages {
		if !aptPackage.MatchString(p) {
			return refuse(schemas.CodeMalformed, fmt.Sprintf("packages[%d]", i), "must be an apt package name (lowercase letters, digits, + - .), optionally =version")
		}
	}
	return nil
}

func validateAgentURL(raw string) error {
	const field = "agent_url"
	if len(raw) > MaxURLLength {
		return refuse(schemas.CodeValueTooLong, field, "at most %d bytes", MaxURLLength)
	}
	if !printableASCII.MatchString(raw) {
		return refuse(schemas.CodeMalformed, field, "must be printable ASCII without spaces")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return refuse(schemas.CodeMalformed, field, "not a URL")
	}
	if u.Scheme != "https" && u.Scheme != "http" {
		return refuse(schemas.CodeMalformed, field, "must be an https (or http) URL; agent_sha256 checks what arrives")
	}
	if u.Host == "" || u.Hostname() == "" {
		return refuse(schemas.CodeMalformed, field, "has no host")
	}
	if u.User != nil {
		return refuse(schemas.CodeMalformed, field, "must not carry credentials (user:password@); user data is readable from the machine's metadata service")
	}
	if strings.Contains(raw, "#") {
		return refuse(schemas.CodeMalformed, field, "must not have a #fragment")
	}
	return nil
}

// ValidateBootstrap checks what a machine needs from b to enroll. The
// token's value is never repeated in the refusal.
func ValidateBootstrap(b schemas.NodeBootstrap) error {
	if b.ControlPlaneURL == "" {
		return refuse(schemas.CodeMissingField, "control_plane_url", "the agent needs the NATS URL to dial")
	}
	if err := schemas.ValidateID("node_id", b.NodeID, schemas.CodeMalformed); err != nil {
		return err
	}
	if b.RentalID != "" {
		if err := schemas.ValidateID("rental_id", b.RentalID, schemas.CodeMalformed); err != nil {
			return err
		}
	}
	if b.Generation == 0 {
		return refuse(schemas.CodeMissingField, "generation", "must be 1 or more")
	}
	if b.EnrollmentToken == "" {
		return refuse(schemas.CodeTokenRequired, "enrollment_token", "mint one with `warmfleet node invite`")
	}
	return nil
}
