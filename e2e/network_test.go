package e2e

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/noderuntime"
	"github.com/warmfleet/warmfleet/schemas"
)

// testName is the name the test's DNS responder answers, with testAddr
// (a documentation address no packet is sent to).
const (
	testName = "svc.warmfleet.test."
	testAddr = "192.0.2.10"
)

// TestAcceptance_RunHasNetwork: a Run on the default (bridge) network
// fetches a page the test serves on the bridge's gateway address and
// resolves a name through the DNS server its resolv.conf names (the test's,
// on the same address: no packet leaves this machine); a "none" Run
// reaches nothing and has only loopback; a "host" Run sees the host's
// interfaces. After 50 more bridged Runs, ten at a time, no veth is left on
// the bridge and no address lease in the IPAM dir.
func TestAcceptance_RunHasNetwork(t *testing.T) {
	w := newWorld(t)
	w.bridge.Create(t)
	gw := w.bridge.Gateway.String()
	web := serveHTTP(t, gw)
	dns := serveDNS(t, gw)
	w.resolvConf = filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(w.resolvConf, []byte("nameserver "+gw+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	f := newFleet(t)
	all := []string{}
	for _, m := range noderuntime.AllNetworkModes() {
		all = append(all, string(m))
	}
	f.startAgent(agentSpec{id: "node-net", world: w, networkModes: all}) // as --allow-host-network: the "host" Run below needs it
	url := "http://" + web.addr + "/"
	run := func(id, network, script string) string {
		return f.submit(schemas.RunRequest{RequestID: id, Image: w.image.Reference, Network: network, Command: []string{"sh", "-c", script},
			MaxRuntimeSeconds: 60})
	}

	// Exit codes say what the Run saw: 0 is the expected view. (No wget -T:
	// Debian 12's static busybox 1.35 crashes on it; max_runtime bounds a
	// hang instead.)
	bridged := run("net-bridge", "", `test "$(busybox wget -q -O - `+url+`)" = hello-from-host || exit 3
busybox nslookup `+strings.TrimSuffix(testName, ".")+` | grep -q `+testAddr+` || exit 4`)
	isolated := run("net-none", "none", `busybox wget -q -O /dev/null `+url+` && exit 3
test "$(grep -c : /proc/net/dev)" = 1 && grep -q '^ *lo:' /proc/net/dev || exit 4`)
	hosted := run("net-host", "host", `grep -q '^ *`+w.bridge.Name+`:' /proc/net/dev`)
	for _, id := range []string{bridged, isolated, hosted} {
		f.waitPhase(id, schemas.PhaseSucceeded, 90*time.Second)
	}
	if web.hits.Load() != 1 {
		t.Errorf("the server saw %d requests, want the bridged Run's one (the isolated one must not reach it)", web.hits.Load())
	}
	if dns.answered.Load() == 0 {
		t.Error("the DNS responder answered nothing; the bridged Run resolved the name elsewhere")
	}

	// 50 bridged Runs, ten at a time, each fetching the page.
	const runs, batch = 50, 10
	for b := 0; b < runs; b += batch {
		var ids []string
		for i := b; i < b+batch; i++ {
			ids = append(ids, run("net-many-"+strconv.Itoa(i), "bridge", `busybox wget -q -O /dev/null `+url))
		}
		for _, id := range ids {
			f.waitPhase(id, schemas.PhaseSucceeded, 90*time.Second)
		}
	}
	if got := web.hits.Load(); got != 1+runs {
		t.Errorf("the server saw %d requests, want %d", got, 1+runs)
	}
	// The agent removes each workload once its exit is reported; its
	// network goes with it.
	f.eventually(30*time.Second, "every veth and lease released", func() bool {
		return len(w.bridge.Ports(t)) == 0 && len(testenv.IPAMLeases(t, w.ipamDir)) == 0
	})
}

// TestAcceptance_SharedMemorySized: /dev/shm inside a Run's container has
// the size shm_bytes asks for; without it, half the memory limit, or 1 GiB
// without a memory limit. A Run's ulimits reach its processes too.
func TestAcceptance_SharedMemorySized(t *testing.T) {
	w := newWorld(t)
	f := newFleet(t)
	f.startAgent(agentSpec{id: "node-shm", world: w})
	shm := func(id string, shmBytes, memory int64, wantKiB int64) string {
		return f.submit(schemas.RunRequest{RequestID: id, Image: w.image.Reference, ShmBytes: shmBytes, Network: "none",
			Resources: schemas.Resources{MemoryBytes: memory},
			Command:   []string{"sh", "-c", fmt.Sprintf(`grep ' /dev/shm ' /proc/mounts | grep -q 'size=%dk' || { cat /proc/mounts; exit 3; }`, wantKiB)}})
	}
	ids := []string{
		shm("shm-asked", 64<<20, 256<<20, 64<<10),
		shm("shm-half-memory", 0, 256<<20, 128<<10),
		shm("shm-default", 0, 0, 1<<20),
		f.submit(schemas.RunRequest{RequestID: "ulimits", Image: w.image.Reference, Network: "none",
			Ulimits: []schemas.Ulimit{{Name: "nofile", Soft: 2048, Hard: 4096}},
			Command: []string{"sh", "-c", `test "$(ulimit -n) $(ulimit -Hn)" = "2048 4096"`}}),
	}
	for _, id := range ids {
		f.waitPhase(id, schemas.PhaseSucceeded, 90*time.Second)
	}
}

// webServer counts the requests it answered.
type webServer struct {
	addr string
	hits atomic.Int64
}

// serveHTTP serves "hello-from-host" on ip until t ends.
func serveHTTP(t *testing.T, ip string) *webServer {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatal(err)
	}
	ws := &webServer{addr: ln.Addr().String()}
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		ws.hits.Add(1)
		_, _ = rw.Write([]byte("hello-from-host"))
	})}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("http server: %v", err)
		}
	}()
	t.Cleanup(func() { _ = srv.Close(); <-done })
	return ws
}

// dnsServer answers testName's A query with testAddr.
type dnsServer struct {
	answered atomic.Int64
}

// serveDNS answers DNS queries on ip:53 (UDP) until t ends: testName has
// testAddr, any other name does not exist.
func serveDNS(t *testing.T, ip string) *dnsServer {
	t.Helper()
	pc, err := net.ListenPacket("udp4", net.JoinHostPort(ip, "53"))
	if err != nil {
		t.Fatal(err)
	}
	ds := &dnsServer{}
	var wg sync.WaitGroup
	wg.Go(func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return // closed
			}
			if resp, ok := ds.answer(buf[:n]); ok {
				_, _ = pc.WriteTo(resp, from)
			}
		}
	})
	t.Cleanup(func() { _ = pc.Close(); wg.Wait() })
	return ds
}

func (ds *dnsServer) answer(query []byte) ([]byte, bool) {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil {
		return nil, false
	}
	q, err := p.Question()
	if err != nil {
		return nil, false
	}
	known := strings.EqualFold(q.Name.String(), testName)
	rh := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired}
	if !known {
		rh.RCode = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(nil, rh)
	if b.StartQuestions() != nil || b.Question(q) != nil || b.StartAnswers() != nil {
		return nil, false
	}
	if known && q.Type == dnsmessage.TypeA {
		a := [4]byte(net.ParseIP(testAddr).To4())
		if b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 5}, dnsmessage.AResource{A: a}) != nil {
			return nil, false
		}
		ds.answered.Add(1)
	}
	resp, err := b.Finish()
	return resp, err == nil
}
