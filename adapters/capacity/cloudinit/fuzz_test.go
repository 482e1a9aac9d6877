package cloudinit_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/adapters/capacity/cloudinit"
	"github.com/warmfleet/warmfleet/schemas"
)

// Whatever an operator (or a control plane) hands the renderer, it must not
// panic; a refusal is coded, names a field and never repeats the token;
// what it accepts is #cloud-config YAML whose bootstrap decodes to exactly
// the JSON of its input, whose runcmd owes nothing to the bootstrap, and
// whose clear text never carries the token.
func FuzzRender(f *testing.F) {
	f.Add("https://dl.example/warmfleet-agent", testSHA, false, true, false, "jq\nhtop", "gpu-1", "r-1", uint64(1), testToken, "nats://cp:4222")
	f.Add("", "", true, false, true, "", "n", "", uint64(7), "t0k3n-with-'quotes'-and-$(x)", "tls://a:1,tls://b:1")
	f.Add("http://u:p@h/x", "ZZ", false, false, false, "-y\n", "a b", "r/1", uint64(0), "", "")
	f.Add("https://h/'`$(id)`'", strings.ToUpper(testSHA), false, false, false, "nvidia-driver-550=550.1-0ubuntu1", "node.1:x", "r", uint64(1<<63), "tok\n\x00\xff", "nats://[::1]:4222")
	f.Fuzz(func(t *testing.T, agentURL, sha string, preinstalled, containerd, nvidia bool, pkgs, nodeID, rentalID string, gen uint64, token, cpURL string) {
		o := cloudinit.Options{AgentURL: agentURL, AgentSHA256: sha, AgentPreinstalled: preinstalled, InstallContainerd: containerd, NVIDIAContainerToolkit: nvidia}
		if pkgs != "" {
			o.Packages = strings.Split(pkgs, "\n")
		}
		b := schemas.NodeBootstrap{ControlPlaneURL: cpURL, NodeID: nodeID, RentalID: rentalID, Generation: gen,
			EnrollmentToken: token, ExpiresAt: time.Unix(1700000000, 0).UTC()}
		out, err := cloudinit.Render(b, o)
		if err != nil {
			var r *schemas.Refusal
			if !errors.As(err, &r) || r.Code == "" || r.Field == "" {
				t.Fatalf("refusal %v is not coded or names no field", err)
			}
			if len(token) >= 16 && strings.Contains(err.Error(), token) {
				t.Fatalf("refusal carries the token: %v", err)
			}
			if _, serr := cloudinit.Script(b, o); o.Validate() != nil && serr == nil {
				t.Fatalf("Script took options Validate refuses")
			}
			return
		}
		u := parse(t, out)
		bf := file(t, u, cloudinit.BootstrapPath)
		got, err := base64.StdEncoding.DecodeString(bf.Content)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := json.Marshal(b)
		if !bytes.Equal(got, want) || bf.Permissions != "0600" || bf.Owner != "root:root" {
			t.Fatalf("bootstrap file %+v decodes to %q, want %q", bf, got, want)
		}
		cmd := runcmd(t, u)
		other := schemas.NodeBootstrap{ControlPlaneURL: "nats://x:1", NodeID: "other", Generation: 1, EnrollmentToken: "other"}
		out2, err := cloudinit.Render(other, o)
		if err != nil {
			t.Fatalf("options accepted once, refused with another bootstrap: %v", err)
		}
		if runcmd(t, parse(t, out2)) != cmd {
			t.Fatalf("runcmd depends on the bootstrap")
		}
		// Outside the bootstrap's base64 content the token appears nowhere
		// (unless it happens to spell text every rendering holds).
		clear := bytes.Replace(out, []byte(bf.Content), nil, 1)
		if len(token) >= 8 && bytes.Contains(clear, []byte(token)) && !bytes.Contains(out2, []byte(token)) {
			t.Fatalf("user data carries the token in the clear")
		}
		if !preinstalled && !strings.Contains(cmd, "sha256sum -c") {
			t.Fatalf("downloading runcmd without a sha256 check:\n%s", cmd)
		}
	})
}
