package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/schemas"
)

// rawSocketProbe is the program a hostile Run executes: it opens a UDP
// socket (the control: sockets work at all), then an AF_INET raw socket
// and an AF_PACKET one, and prints what each gave. It exits 0 only when
// both raw sockets were refused.
const rawSocketProbe = `package main

import (
	"fmt"
	"os"
	"syscall"
)

func main() {
	code := 0
	for _, s := range []struct {
		name                  string
		domain, typ, protocol int
		want                  error
	}{
		{"udp", syscall.AF_INET, syscall.SOCK_DGRAM, 0, nil},
		{"inet-raw", syscall.AF_INET, syscall.SOCK_RAW, syscall.IPPROTO_ICMP, syscall.EPERM},
		{"packet", syscall.AF_PACKET, syscall.SOCK_RAW, 0x0300, syscall.EPERM}, // ETH_P_ALL, network order
	} {
		fd, err := syscall.Socket(s.domain, s.typ, s.protocol)
		switch {
		case err == nil:
			syscall.Close(fd)
			fmt.Printf("%s: opened\n", s.name)
		case err == syscall.EPERM:
			fmt.Printf("%s: EPERM\n", s.name)
		default:
			fmt.Printf("%s: %v\n", s.name, err)
		}
		if err != s.want {
			code = 1
		}
	}
	os.Exit(code)
}
`

// TestAcceptance_HostileRun: under auth and TLS, with real agent processes
// and containerd, a Run asking for the host's network is refused by a
// default agent's node with its code; on an agent started with
// --allow-host-network the Run shares the host's network yet cannot open a
// raw or packet socket; and a capture of loopback from the host's
// namespace, taken while both agents log in, run and restart, holds none
// of the fleet's secrets, session tokens included, though it holds a
// plaintext marker sent beside them.
func TestAcceptance_HostileRun(t *testing.T) {
	bin := testenv.BuildCommand(t, "github.com/warmfleet/warmfleet/cmd/warmfleet-agent")
	w := newWorld(t)
	img := testenv.BuildBusyboxImage(t, w.imageDir, "hostile", testenv.WithFile("/probe/rawsock", string(buildProbe(t))))
	sf := newSecureFleet(t)

	u, err := url.Parse(sf.url)
	if err != nil {
		t.Fatal(err)
	}
	natsPort, err := strconv.ParseUint(u.Port(), 10, 16)
	if err != nil {
		t.Fatal(err)
	}
	marker, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer marker.Close()
	markerPort := uint16(marker.Addr().(*net.TCPAddr).Port)
	capture := startLoopCapture(t, uint16(natsPort), markerPort)

	// (a) A default agent does not offer the host's network: the Run fails
	// at once, its node's rejection coded and naming field and flag.
	def := sf.startAgentProcess(bin, w, "default-node")
	def.waitModes(sf, []string{"bridge", "none"})
	refused := sf.submit(schemas.RunRequest{RequestID: "host-refused", Image: img.Reference, Network: schemas.NetworkHost, Command: []string{"true"}})
	if r := sf.waitPhase(refused, schemas.PhaseFailed, 60*time.Second); r.Reason != string(schemas.CodeUnsatisfiable) || r.NodeID != "" {
		t.Fatalf("host Run on a default fleet ended %s (%s) on %q, want failed %s", r.Phase, r.Reason, r.NodeID, schemas.CodeUnsatisfiable)
	}
	c := candidate(sf.decision(refused), "default-node")
	if c.Reason != schemas.ReasonNetworkUnavailable || !strings.Contains(c.Detail, "network") || !strings.Contains(c.Detail, "--allow-host-network") {
		t.Fatalf("default-node rejected for %q (%s), want %s naming the field and --allow-host-network", c.Reason, c.Detail, schemas.ReasonNetworkUnavailable)
	}
	// The Run's end, as `run submit --wait` prints it, says what to do.
	if !slices.ContainsFunc(sf.events(refused), func(ev schemas.RunEvent) bool {
		return ev.Type == schemas.EventPhase && ev.Phase == schemas.PhaseFailed && strings.Contains(ev.Message, "--allow-host-network")
	}) {
		t.Fatal("the Run's failure does not say how to get host networking")
	}

	// (b) On an agent that allows it, the host-network Run still holds no
	// CAP_NET_RAW.
	host := sf.startAgentProcess(bin, w, "host-node", "--allow-host-network")
	host.waitModes(sf, []string{"bridge", "host", "none"})
	hostile := sf.submit(schemas.RunRequest{RequestID: "host-hostile", Image: img.Reference, Network: schemas.NetworkHost,
		Command: []string{"sh", "-c", "cp /probe/rawsock /tmp/rawsock && chmod 755 /tmp/rawsock && exec /tmp/rawsock"}})
	r := sf.waitPhase(hostile, "", 120*time.Second)
	out := sf.stored(hostile).bytes[[2]string{schemas.WorkloadID(hostile, 1), bus.LogStdout}]
	if want := "udp: opened\ninet-raw: EPERM\npacket: EPERM\n"; r.Phase != schemas.PhaseSucceeded || r.NodeID != "host-node" || string(out) != want {
		t.Fatalf("hostile Run ended %s (%s) on %q printing %q, want succeeded on host-node printing %q", r.Phase, r.Reason, r.NodeID, out, want)
	}

	// (c) The host-node restarts and logs in with its saved session; the
	// marker crosses loopback in two writes beside it.
	tokens := map[string]string{"default-node session": def.sessionToken(), "host-node session": host.sessionToken()}
	host.restart(sf)
	tokens["host-node session after restart"] = host.sessionToken()
	sendMarker(t, marker, "plaintext-marker-", "seen-on-loopback")
	capture.stop()

	for name, v := range sf.secrets {
		tokens[name] = v
	}
	natsStreams := capture.streams(uint16(natsPort))
	total := 0
	for _, s := range natsStreams {
		total += len(s)
	}
	// Two agents, their log connections, the control plane and the
	// operator: many connections, and far more than a few handshakes.
	if len(natsStreams) < 8 || total < 64<<10 {
		t.Fatalf("captured %d flows, %d bytes on the NATS port: the capture missed the fleet's traffic", len(natsStreams), total)
	}
	t.Logf("captured %d flows, %d bytes on the NATS port", len(natsStreams), total)
	// The server's INFO line precedes the TLS handshake: the one plaintext
	// the NATS port carries, proof the capture reads those flows.
	if !slices.ContainsFunc(natsStreams, func(s []byte) bool { return bytes.Contains(s, []byte(`"tls_required":true`)) }) {
		t.Fatal("no INFO line in the NATS port's flows: the capture cannot show a token absent")
	}
	for name, v := range tokens {
		if len(v) < 16 {
			t.Fatalf("%s is %d bytes: not a secret to search for", name, len(v))
		}
		for _, s := range natsStreams {
			if bytes.Contains(s, []byte(v)) {
				t.Errorf("%s crossed loopback in clear", name)
			}
		}
	}
	if !slices.ContainsFunc(capture.streams(markerPort), func(s []byte) bool { return bytes.Contains(s, []byte("plaintext-marker-seen-on-loopback")) }) {
		t.Fatal("the capture missed the plaintext marker: it cannot show a token absent")
	}
}

// buildProbe compiles rawSocketProbe as a static binary.
func buildProbe(t *testing.T) []byte {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(rawSocketProbe), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "build", "-o", "rawsock", "main.go")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GO111MODULE=off", "GOFLAGS=")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the probe: %v\n%s", err, b)
	}
	b, err := os.ReadFile(filepath.Join(dir, "rawsock"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// sendMarker writes a + b over a loopback TCP connection to ln, in two
// writes, and waits until ln's side read them all.
func sendMarker(t *testing.T, ln net.Listener, a, b string) {
	t.Helper()
	read := make(chan []byte, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			read <- nil
			return
		}
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		buf := make([]byte, len(a)+len(b))
		n, _ := io.ReadFull(c, buf)
		read <- buf[:n]
	}()
	c, err := net.Dial("tcp4", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, part := range []string{a, b} {
		if _, err := c.Write([]byte(part)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond) // two segments
	}
	if got := <-read; string(got) != a+b {
		t.Fatalf("marker read %q", got)
	}
}

// agentProcess is a warmfleet-agent process logging in under auth with
// TLS, as a node's unit runs it.
type agentProcess struct {
	t       *testing.T
	id      string
	bin     string
	args    []string
	dataDir string
	cmd     *exec.Cmd
	fencing uint64 // the node record's fencing token when last seen enrolled
}

// startAgentProcess invites node id and starts the agent binary with that
// bootstrap, TLS and extra flags, on w's containerd and bridge.
func (sf *secureFleet) startAgentProcess(bin string, w world, id string, extra ...string) *agentProcess {
	sf.t.Helper()
	boot := sf.invite(id, 1, time.Minute)
	sf.plant("invitation of "+id, boot.EnrollmentToken)
	b, err := json.Marshal(boot)
	if err != nil {
		sf.t.Fatal(err)
	}
	bootFile := filepath.Join(sf.t.TempDir(), id+".bootstrap.json")
	if err := os.WriteFile(bootFile, b, 0o600); err != nil {
		sf.t.Fatal(err)
	}
	p := &agentProcess{t: sf.t, id: id, bin: bin, dataDir: tempDir(sf.t)}
	p.args = append([]string{"--bootstrap", bootFile, "--nats-url", sf.url, "--nats-auth",
		"--tls-ca", sf.pki.CAFile, "--tls-cert", sf.pki.ClientCert, "--tls-key", sf.pki.ClientKey, "--data-dir", p.dataDir,
		"--containerd-address", w.ctrd.Address, "--containerd-namespace", w.ctrd.Namespace, "--image-dir", w.imageDir,
		"--network-bridge", w.bridge.Name, "--network-subnet", w.bridge.Subnet, "--network-ipam-dir", w.ipamDir,
		"--facts-interval", "1s"}, extra...)
	p.start()
	sf.t.Cleanup(p.stop)
	return p
}

func (p *agentProcess) start() {
	p.t.Helper()
	out, err := os.Create(filepath.Join(p.t.TempDir(), p.id+".log"))
	if err != nil {
		p.t.Fatal(err)
	}
	p.cmd = exec.Command(p.bin, p.args...)
	p.cmd.Stdout, p.cmd.Stderr = out, out
	if err := p.cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
	p.t.Cleanup(func() {
		if p.t.Failed() {
			b, _ := os.ReadFile(out.Name())
			p.t.Logf("%s:\n%s", p.id, b[max(0, len(b)-20000):])
		}
	})
}

// stop ends the process with SIGTERM, as systemd does.
func (p *agentProcess) stop() {
	if p.cmd == nil || p.cmd.ProcessState != nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
		p.t.Errorf("%s did not stop within 30s of SIGTERM", p.id)
	}
}

// restart stops the process and starts it again on the same data dir: it
// logs in with its saved session, and re-enrolls.
func (p *agentProcess) restart(sf *secureFleet) {
	p.t.Helper()
	p.stop()
	before := p.fencing
	p.start()
	sf.eventually(60*time.Second, p.id+" enrolled again", func() bool {
		rec, ok := p.record(sf)
		return ok && rec.State == schemas.NodeReady && rec.FencingToken > before
	})
}

// waitModes waits until the node is enrolled and its facts offer exactly
// modes.
func (p *agentProcess) waitModes(sf *secureFleet, modes []string) {
	p.t.Helper()
	sf.eventually(90*time.Second, p.id+" enrolled offering "+strings.Join(modes, ","), func() bool {
		rec, ok := p.record(sf)
		if !ok || rec.State != schemas.NodeReady || rec.Facts == nil {
			return false
		}
		p.fencing = rec.FencingToken
		return slices.Equal(rec.Facts.Host.NetworkModes, modes)
	})
}

func (p *agentProcess) record(sf *secureFleet) (schemas.NodeRecord, bool) {
	kv, err := sf.conn.JS.KeyValue(context.Background(), bus.BucketNodes)
	if err != nil {
		p.t.Fatal(err)
	}
	var rec schemas.NodeRecord
	_, err = bus.GetJSON(context.Background(), kv, p.id, &rec)
	return rec, err == nil
}

// sessionToken is the session token the agent saved in its data dir.
func (p *agentProcess) sessionToken() string {
	p.t.Helper()
	b, err := os.ReadFile(filepath.Join(p.dataDir, "session.json"))
	if err != nil {
		p.t.Fatal(err)
	}
	var s struct {
		SessionToken string `json:"session_token"`
	}
	if err := json.Unmarshal(b, &s); err != nil {
		p.t.Fatal(err)
	}
	return s.SessionToken
}
