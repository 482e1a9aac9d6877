package cloudinit

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"slices"

	"go.yaml.in/yaml/v3"

	"github.com/warmfleet/warmfleet/deploy"
	"github.com/warmfleet/warmfleet/schemas"
)

// userData is the part of cloud-init's #cloud-config schema we write.
// cloud-init runs write_files early (init stage), then installs packages,
// then runcmd (final stage).
type userData struct {
	PackageUpdate bool        `yaml:"package_update,omitempty"`
	Packages      []string    `yaml:"packages,omitempty"`
	WriteFiles    []writeFile `yaml:"write_files"`
	Runcmd        [][]string  `yaml:"runcmd"`
}

type writeFile struct {
	Path        string `yaml:"path"`
	Owner       string `yaml:"owner"`
	Permissions string `yaml:"permissions"`
	Encoding    string `yaml:"encoding,omitempty"`
	Content     string `yaml:"content"`
}

// Render is b as #cloud-config user data. write_files puts the bootstrap at
// BootstrapPath (root, 0600; base64 content, so it never passes through a
// shell or a log) and the agent's systemd unit at UnitPath; packages installs
// containerd, runc and the extras o names; one runcmd entry (a bash script
// with set -e) downloads the agent and checks its sha256 — a mismatch stops
// it before anything starts — then enables and starts warmfleet-agent.
// Nothing in runcmd carries the token. Invalid input is a *schemas.Refusal
// naming the field.
func Render(b schemas.NodeBootstrap, o Options) ([]byte, error) {
	if err := ValidateBootstrap(b); err != nil {
		return nil, err
	}
	if err := o.Validate(); err != nil {
		return nil, err
	}
	payload, err := bootstrapPayload(b)
	if err != nil {
		return nil, refuse(schemas.CodeMalformed, "", "bootstrap does not encode as JSON")
	}
	doc := userData{
		Packages: packages(o),
		WriteFiles: []writeFile{
			{Path: BootstrapPath, Owner: "root:root", Permissions: "0600", Encoding: "b64", Content: base64.StdEncoding.EncodeToString(payload)},
			{Path: UnitPath, Owner: "root:root", Permissions: "0644", Content: deploy.AgentUnit},
		},
		Runcmd: [][]string{{"bash", "-c", agentSteps(o), "warmfleet-bootstrap"}},
	}
	doc.PackageUpdate = len(doc.Packages) > 0
	var out bytes.Buffer
	out.WriteString("#cloud-config\n")
	fmt.Fprintf(&out, "# warmfleet node %s, generation %d. This user data holds a single-use\n", b.NodeID, b.Generation)
	out.WriteString("# enrollment token: keep it private. Rendered by warmfleet; see deploy/cloud-init.\n")
	enc := yaml.NewEncoder(&out)
	enc.SetIndent(2)
	if err := enc.Encode(doc); err != nil {
		return nil, refuse(schemas.CodeInternal, "", "user data does not encode as YAML")
	}
	if err := enc.Close(); err != nil {
		return nil, refuse(schemas.CodeInternal, "", "user data does not encode as YAML")
	}
	return out.Bytes(), nil
}

// packages is what apt installs before runcmd: curl (and CA certificates)
// for the download, the container runtime, and o's extras, without repeats.
func packages(o Options) []string {
	var p []string
	if !o.AgentPreinstalled {
		p = append(p, "ca-certificates", "curl")
	}
	if o.InstallContainerd {
		p = append(p, "containerd", "runc")
	}
	if o.NVIDIAContainerToolkit {
		p = append(p, "nvidia-container-toolkit")
	}
	for _, x := range o.Packages {
		if !slices.Contains(p, x) {
			p = append(p, x)
		}
	}
	return p
}
