package residency

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/nodelog"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	ctrdrt "github.com/warmfleet/warmfleet/adapters/containerd"
	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/internal/testenv"
)

// TestMain fails the package if a goroutine outlives the tests: the Manager
// promises that Close stops everything it started. It also keeps the
// property test's default run short (override with -rapid.checks or
// RAPID_CHECKS).
func TestMain(m *testing.M) {
	if code, ok := nodelog.WriterMain(os.Args); ok {
		os.Exit(code) // the workloads' log writer
	}
	flag.Parse()
	checksSet := false
	flag.Visit(func(f *flag.Flag) { checksSet = checksSet || f.Name == "rapid.checks" })
	if _, env := os.LookupEnv("RAPID_CHECKS"); !checksSet && !env {
		_ = flag.Set("rapid.checks", "15")
	}
	goleak.VerifyTestMain(m)
}

const (
	compatA = "busybox-sleep@1"
	tenant  = "acme"
)

// testCtx bounds a test so a hang fails instead of stalling CI, with room
// for containerd on a loaded machine.
func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// busEnv is an embedded NATS with the topology provisioned.
type busEnv struct {
	conn *bus.Conn
	js   jetstream.JetStream
}

func newBus(t testing.TB) *busEnv {
	t.Helper()
	n := testenv.StartNATS(t)
	conn, err := bus.Connect(n.URL(), t.Name(), zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	if err := bus.Provision(testCtx(t), conn.JS, bus.Topology{}); err != nil {
		t.Fatal(err)
	}
	return &busEnv{conn: conn, js: conn.JS}
}

// controlPlane is the control-plane side: the KV lease and location stores.
type controlPlane struct {
	leases    *KVLeases
	locations *KVLocations
}

func newControlPlane(t testing.TB, env *busEnv, clock Clock, ttl, ackWait time.Duration) *controlPlane {
	t.Helper()
	ctx := testCtx(t)
	l, err := NewKVLeases(ctx, KVLeasesOptions{JS: env.js, TTL: ttl, InboxAckWait: ackWait, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	loc, err := NewKVLocations(ctx, KVLocationsOptions{JS: env.js, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	return &controlPlane{leases: l, locations: loc}
}

// ctrdEnv is a private containerd with the busybox image imported.
type ctrdEnv struct {
	rt     *ctrdrt.Runtime
	target RuntimeTarget
}

func newContainerd(t testing.TB) *ctrdEnv {
	t.Helper()
	env := testenv.StartContainerd(t)
	imgDir := t.TempDir()
	img := testenv.BuildBusyboxImage(t, imgDir, "busybox")
	bridge := testenv.NewBridge(t) // sessions get the bridge network
	rt, err := ctrdrt.New(testCtx(t), ctrdrt.Options{
		Address: env.Address, Namespace: env.Namespace, ImageDir: imgDir,
		LogDir: filepath.Join(env.Dir, "logs"), StateDir: filepath.Join(env.Dir, "runtime"),
		Network: ctrdrt.NetworkOptions{Bridge: bridge.Name, Subnet: bridge.Subnet}, Logger: zap.NewNop(),
	})
	if err != nil {
		t.Fatalf("containerd runtime: %v", err)
	}
	t.Cleanup(func() {
		// Whatever a test left is removed with its network before
		// containerd stops.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if ws, err := rt.List(ctx); err == nil {
			for _, w := range ws {
				_ = rt.Remove(ctx, w.ID)
			}
		}
		_ = rt.Close()
	})
	return &ctrdEnv{rt: rt, target: RuntimeTarget{
		Image: img.Reference, ManifestDigest: img.ManifestDigest, Command: []string{"sleep", "3600"},
		CompatibilityID: compatA, StopGrace: 50 * time.Millisecond,
	}}
}

// workloads lists the residency workloads containerd holds.
func (c *ctrdEnv) workloads(t testing.TB) []string {
	t.Helper()
	ws, err := c.rt.List(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, w := range ws {
		if w.Labels[LabelSession] != "" {
			out = append(out, w.ID)
		}
	}
	sort.Strings(out)
	return out
}

// host is one Manager with the collaborators a test inspects.
type host struct {
	id     string
	mgr    *Manager
	ledger *Ledger
	ws     *DirWorkspaces
	faults *faults
	link   *link
}

type hostConfig struct {
	id      string
	cp      *controlPlane
	env     *busEnv
	durable DurableStore
	runtime Runtime
	target  RuntimeTarget
	handler Handler
	clock   Clock
	warmTTL time.Duration
	confirm WarmConfirmer
	// releaseBound is Options.ReleaseBound; its default (30 s) when zero:
	// a containerd teardown on a loaded machine can take several seconds.
	releaseBound time.Duration
	heartbeat    time.Duration
	capacity     int
	hooks        Hooks
	logger       *zap.Logger
	// checkpoints is Options.Checkpoints: nil keeps workspaces local;
	// checkpointInterval Options.CheckpointInterval.
	checkpoints        CheckpointStores
	checkpointInterval time.Duration
	checkpointPoll     time.Duration
}

func newHost(t testing.TB, c hostConfig) *host {
	t.Helper()
	if c.capacity == 0 {
		c.capacity = 8
	}
	if c.clock == nil {
		c.clock = SystemClock{}
	}
	if c.logger == nil {
		c.logger = zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	}
	ledger, err := NewLedger(c.capacity)
	if err != nil {
		t.Fatal(err)
	}
	ws, err := NewDirWorkspaces(filepath.Join(t.TempDir(), c.id))
	if err != nil {
		t.Fatal(err)
	}
	h := &host{id: c.id, ledger: ledger, ws: ws, faults: newFaults(), link: &link{}}
	m, err := New(Options{
		HostID:             c.id,
		Logger:             c.logger.Named(c.id),
		Clock:              c.clock,
		Admissions:         faultyAdmissions{ledger, h.faults},
		Leases:             hostLeases{c.cp.leases, h.link, h.faults},
		Locations:          hostLocations{c.cp.locations, h.link, h.faults},
		Durable:            faultyDurable{c.durable, h.faults},
		Workspaces:         faultyWorkspaces{ws, h.faults},
		Runtime:            faultyRuntime{c.runtime, h.faults},
		Target:             c.target,
		Inboxes:            faultyInboxes{JetStreamInboxes{JS: c.env.js}, h.faults},
		Handler:            c.handler,
		WarmTTL:            c.warmTTL,
		Confirm:            c.confirm,
		HeartbeatInterval:  c.heartbeat,
		FetchWait:          20 * time.Millisecond,
		RetryDelay:         50 * time.Millisecond,
		ReleaseBound:       c.releaseBound,
		Hooks:              c.hooks,
		Checkpoints:        c.checkpoints,
		CheckpointInterval: c.checkpointInterval,
		CheckpointPoll:     c.checkpointPoll,
	})
	if err != nil {
		t.Fatal(err)
	}
	h.mgr = m
	t.Cleanup(m.Close)
	return h
}

func request(key Key, mode Mode) Request {
	return Request{Key: key, Mode: mode, Principal: Principal{TenantID: key.Tenant, ActorID: "tester", TraceID: "trace-1"}}
}

// handled is one message a handler acted on.
type handled struct {
	id    string
	host  string
	epoch ResidencyEpoch
	seq   int
}

// recorder is the work's "effect": the handler records each message it
// acts on, under a fence check.
type recorder struct {
	mu   sync.Mutex
	seq  int
	done []handled
	// gate, when set, makes the fence check and the effect atomic with
	// respect to a fake clock's Advance.
	gate *sync.RWMutex
	// refused counts handler calls refused by the fence.
	refused atomic.Int64
}

func (r *recorder) handler(hostID string) Handler {
	return func(_ context.Context, w Work) error {
		if r.gate != nil {
			r.gate.RLock()
			defer r.gate.RUnlock()
		}
		if err := w.Guard.Check(); err != nil {
			r.refused.Add(1)
			return err
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		r.seq++
		r.done = append(r.done, handled{id: w.MsgID, host: hostID, epoch: w.Guard.Epoch(), seq: r.seq})
		return nil
	}
}

func (r *recorder) snapshot() []handled {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]handled(nil), r.done...)
}

// checkOnce asserts each of ids was handled exactly once, nothing else was,
// and grants took turns: once a later epoch handled work, no earlier epoch
// handled any again.
func (r *recorder) checkOnce(ids []string) error {
	done := r.snapshot()
	count := map[string]int{}
	for _, h := range done {
		count[h.id]++
	}
	for _, id := range ids {
		if count[id] != 1 {
			return fmt.Errorf("message %s handled %d times", id, count[id])
		}
	}
	if len(done) != len(ids) {
		want := map[string]bool{}
		for _, id := range ids {
			want[id] = true
		}
		var stray []string
		for _, h := range done {
			if !want[h.id] {
				stray = append(stray, h.id)
			}
		}
		return fmt.Errorf("%d handlings for %d messages; not published by the test: %v", len(done), len(ids), stray)
	}
	var maxEpoch ResidencyEpoch
	for _, h := range done {
		if h.epoch < maxEpoch {
			return fmt.Errorf("message %s handled by %s at epoch %d after epoch %d had handled work", h.id, h.host, h.epoch, maxEpoch)
		}
		maxEpoch = h.epoch
	}
	return nil
}

// checkTurns asserts grants took turns handling work: once a later epoch
// handled a message, no earlier epoch handled one again.
func (r *recorder) checkTurns() error {
	var maxEpoch ResidencyEpoch
	for _, h := range r.snapshot() {
		if h.epoch < maxEpoch {
			return fmt.Errorf("message %s handled by %s at epoch %d after epoch %d had handled work", h.id, h.host, h.epoch, maxEpoch)
		}
		maxEpoch = h.epoch
	}
	return nil
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// publishWork puts one message in key's inbox.
func publishWork(ctx context.Context, js jetstream.JetStream, key Key, id string) error {
	_, err := js.Publish(ctx, key.InboxSubject(), []byte("work "+id), jetstream.WithMsgID(id))
	return err
}

// held describes what of key is still held anywhere, for "took nothing"
// assertions. Empty means nothing.
func held(t testing.TB, cp *controlPlane, h *host, key Key, workloads func() []string) []string {
	t.Helper()
	ctx := testCtx(t)
	var out []string
	if rec, _, err := cp.leases.Get(ctx, key); err == nil && rec.Live(time.Now()) {
		out = append(out, fmt.Sprintf("lease (epoch %d, holder %s)", rec.Epoch, rec.Holder))
	} else if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatal(err)
	}
	if _, ok := h.ledger.Charged(key); ok {
		out = append(out, "admission")
	}
	if _, err := os.Stat(h.ws.Path(key)); err == nil {
		out = append(out, "workspace")
	}
	if workloads != nil {
		if ws := workloads(); len(ws) > 0 {
			out = append(out, fmt.Sprintf("runtime %v", ws))
		}
	}
	if obs, _, err := cp.locations.Get(ctx, key); err == nil && obs.State != StateExpired {
		out = append(out, fmt.Sprintf("route (%s at epoch %d)", obs.State, obs.Epoch))
	} else if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatal(err)
	}
	if _, ok := h.mgr.Resident(key); ok {
		out = append(out, "registry")
	}
	return out
}
