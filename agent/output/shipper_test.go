package output

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap/zaptest"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/nodelog"
	"github.com/warmfleet/warmfleet/runlog"
)

type figures struct {
	mu      sync.Mutex
	shipped int64
	behind  int64
}

func (f *figures) Shipped(_ string, bytes, _ int64, _ time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.shipped += bytes
}

func (f *figures) Behind(bytes int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.behind = bytes
}

// shipperOn is a shipper on a real NATS with WF_LOGS; every shipment ends
// with the test.
func shipperOn(t *testing.T, m Metrics) (*Shipper, context.Context, *bus.Conn) {
	t.Helper()
	n := testenv.StartNATS(t)
	conn, err := bus.Connect(n.URL(), "output-test", zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	ctx, cancel := context.WithCancel(context.Background())
	if err := bus.Provision(ctx, conn.JS, bus.Topology{}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	s := New(Config{DataDir: t.TempDir(), NodeID: "node-out", JS: conn.JS, Poll: 10 * time.Millisecond, Now: time.Now,
		Metrics: m, Log: zaptest.NewLogger(t), Group: &wg})
	return s, ctx, conn
}

// write puts a finished workload's output in dir, as the runtime's log
// writer does.
func write(t *testing.T, dir, stdout, stderr string) {
	t.Helper()
	if err := nodelog.Write(nodelog.WriterSpec{Dir: dir}, [2]io.Reader{strings.NewReader(stdout), strings.NewReader(stderr)}, func() {}, time.Now); err != nil {
		t.Fatal(err)
	}
}

func read(t *testing.T, ctx context.Context, conn *bus.Conn, runID string) (stdout, stderr string) {
	t.Helper()
	var out, errs bytes.Buffer
	err := runlog.Read(ctx, conn.JS, bus.RunLogsSubject("default", runID), runlog.Options{}, func(l runlog.Line) error {
		if l.Node != "node-out" {
			t.Errorf("line from node %q", l.Node)
		}
		if l.Stream == bus.LogStderr {
			errs.WriteString(l.Text + "\n")
		} else {
			out.WriteString(l.Text + "\n")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out.String(), errs.String()
}

// A Run's output is stored to the end of both streams, and its directory
// goes once that is done and the exit is reported, not before.
func TestShip_StoresBothStreamsThenRemovesTheDir(t *testing.T) {
	m := &figures{}
	s, ctx, conn := shipperOn(t, m)
	dir, err := PrepareRun(s.cfg.DataDir, "default", "r1", "r1-a1")
	if err != nil || dir != s.Dir("r1-a1") {
		t.Fatalf("dir %q, %v", dir, err)
	}
	write(t, dir, "one\ntwo\n", "oops\n")
	sh, err := s.Ship(ctx, "r1-a1")
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := s.Ship(ctx, "r1-a1"); again != sh {
		t.Error("a second Ship of one attempt started another shipment")
	}
	sh.Finish()
	select {
	case <-sh.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("output not stored")
	}
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("the directory went before the exit was reported: %v", err)
	}
	sh.ReportedDone()
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the directory is left after everything was stored and reported: %v", err)
	}
	if out, errs := read(t, ctx, conn, "r1"); out != "one\ntwo\n" || errs != "oops\n" {
		t.Errorf("stored %q and %q", out, errs)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.shipped != int64(len("one\ntwo\n")+len("oops\n")) || m.behind != 0 {
		t.Errorf("figures: shipped %d, behind %d", m.shipped, m.behind)
	}
}

// Leftovers: a directory whose workload the runtime no longer holds is
// shipped and removed; one it holds is left to its watcher; one without
// its meta is left in place.
func TestShipLeftovers(t *testing.T) {
	s, ctx, conn := shipperOn(t, nil)
	gone, _ := PrepareRun(s.cfg.DataDir, "default", "r2", "r2-a1")
	write(t, gone, "left over\n", "")
	held, _ := PrepareRun(s.cfg.DataDir, "default", "r3", "r3-a1")
	stray := filepath.Join(Root(s.cfg.DataDir), "stray")
	if err := os.MkdirAll(stray, 0o755); err != nil {
		t.Fatal(err)
	}
	s.ShipLeftovers(ctx, map[string]bool{"r3-a1": true})
	deadline := time.Now().Add(10 * time.Second)
	for _, err := os.Stat(gone); err == nil && time.Now().Before(deadline); _, err = os.Stat(gone) {
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := os.Stat(gone); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a leftover directory is not removed: %v", err)
	}
	if out, _ := read(t, ctx, conn, "r2"); out != "left over\n" {
		t.Errorf("stored %q", out)
	}
	for _, d := range []string{held, stray} {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("%s: %v", d, err)
		}
	}
}

// authRefused is what a dial refused by the auth callout returns.
var authRefused = fmt.Errorf("log connection for run r: %w", nats.ErrAuthorization)

// Refused log logins never drop output: the shipment keeps the directory
// through refusal after refusal (past what once meant "for good"), ships
// every byte once a login is admitted, and only then removes it.
func TestShip_RefusedLoginsKeepTheOutput(t *testing.T) {
	s, ctx, conn := shipperOn(t, nil)
	var mu sync.Mutex
	refused, admitAfter := 0, 8
	s.cfg.Dialer = func(context.Context, string) (jetstream.JetStream, func(), error) {
		mu.Lock()
		defer mu.Unlock()
		if refused < admitAfter {
			refused++
			return nil, nil, authRefused
		}
		return conn.JS, func() {}, nil
	}
	dir, _ := PrepareRun(s.cfg.DataDir, "default", "r5", "r5-a1")
	write(t, dir, "kept\nthrough refusals", "")
	sh, err := s.Ship(ctx, "r5-a1")
	if err != nil {
		t.Fatal(err)
	}
	sh.Finish()
	sh.ReportedDone()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		mu.Lock()
		n := refused
		mu.Unlock()
		if n >= logLoginTriesBefore {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d dials in 2 minutes", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("the output went after %d refused logins: %v", logLoginTriesBefore, err)
	}
	select {
	case <-sh.Done():
	case <-time.After(2 * time.Minute):
		t.Fatal("not shipped once the login was admitted")
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the directory is left after everything was stored: %v", err)
	}
	if out, _ := read(t, ctx, conn, "r5"); out != "kept\nthrough refusals\n" {
		t.Errorf("stored %q", out)
	}
}

// logLoginTriesBefore is how many refusals in a row once dropped output.
const logLoginTriesBefore = 6

// An operator drops output no login will be granted for by removing its
// directory: the shipment stops without storing anything.
func TestShip_RemovedWhileRefusedStops(t *testing.T) {
	s, ctx, _ := shipperOn(t, nil)
	s.cfg.Dialer = func(context.Context, string) (jetstream.JetStream, func(), error) { return nil, nil, authRefused }
	dir, _ := PrepareRun(s.cfg.DataDir, "default", "r6", "r6-a1")
	write(t, dir, "never shipped\n", "")
	sh, err := s.Ship(ctx, "r6-a1")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sh.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the shipment goes on after its directory was removed")
	}
	if !errors.Is(sh.err, errDropped) {
		t.Fatalf("stopped with %v, want errDropped", sh.err)
	}
}

// A log connection that closes for good (nats.go stops reconnecting once a
// login is refused) is dialed again, and the output ships on the new one.
func TestShip_RedialsAClosedLogConnection(t *testing.T) {
	s, ctx, conn := shipperOn(t, nil)
	var mu sync.Mutex
	dials := 0
	s.cfg.Dialer = func(context.Context, string) (jetstream.JetStream, func(), error) {
		mu.Lock()
		defer mu.Unlock()
		dials++
		if dials == 1 {
			c := testenv.Dial(t, conn.NC.ConnectedUrl(), "closed-log-conn")
			c.Close()
			return c.JS, func() {}, nil
		}
		return conn.JS, func() {}, nil
	}
	dir, _ := PrepareRun(s.cfg.DataDir, "default", "r7", "r7-a1")
	write(t, dir, "after a redial\n", "")
	sh, err := s.Ship(ctx, "r7-a1")
	if err != nil {
		t.Fatal(err)
	}
	sh.Finish()
	select {
	case <-sh.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("not shipped after the log connection closed")
	}
	mu.Lock()
	defer mu.Unlock()
	if sh.err != nil || dials != 2 {
		t.Fatalf("shipment ended with %v after %d dials, want nil after 2", sh.err, dials)
	}
	if out, _ := read(t, ctx, conn, "r7"); out != "after a redial\n" {
		t.Errorf("stored %q", out)
	}
}
