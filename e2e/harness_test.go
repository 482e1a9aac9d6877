package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/warmfleet/warmfleet/adapters/containerd"
	"github.com/warmfleet/warmfleet/agent"
	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/controlplane"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/schemas"
)

// fleet is one test's world: NATS, a control plane, and node agents.
type fleet struct {
	t    *testing.T
	nats *testenv.NATS
	conn *bus.Conn // the producer's / operator's connection
	log  *zap.Logger
	cfg  controlplane.Config
	cp   *part
	// plane is the running control plane, for its counters.
	plane *controlplane.ControlPlane
}

// part is a component running in a goroutine, stoppable on its own.
type part struct {
	cancel context.CancelFunc
	done   chan struct{} // closed when the goroutine returned
	err    error         // what it returned; read after done
}

func newPart(cancel context.CancelFunc, run func() error) *part {
	p := &part{cancel: cancel, done: make(chan struct{})}
	go func() { defer close(p.done); p.err = run() }()
	return p
}

// wait returns the part's result, or fails t after within.
func (p *part) wait(t testing.TB, within time.Duration) error {
	t.Helper()
	select {
	case <-p.done:
		return p.err
	case <-time.After(within):
		t.Fatalf("part still running after %s", within)
		return nil
	}
}

func (p *part) stop(t testing.TB) {
	p.cancel()
	select {
	case <-p.done:
		if p.err != nil && !errors.Is(p.err, context.Canceled) && !errors.Is(p.err, agent.ErrSuperseded) {
			t.Logf("part stopped with: %v", p.err)
		}
	case <-time.After(20 * time.Second):
		buf := make([]byte, 1<<20)
		t.Errorf("part did not stop within 20s; goroutines:\n%s", buf[:runtime.Stack(buf, true)])
	}
}

func cpConfig() controlplane.Config {
	// The residency tests' sessions are tenant acme's.
	return controlplane.Config{HeartbeatInterval: time.Second, ReconcileInterval: 200 * time.Millisecond, RedispatchAfter: 10 * time.Second,
		CommandAckWait: 3 * time.Second, OpenEnrollment: true, Tenants: []string{schemas.DefaultTenant, "acme"}}
}

func newFleet(t *testing.T, tune ...func(*controlplane.Config)) *fleet {
	t.Helper()
	n := testenv.StartNATS(t)
	log := zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel))
	conn, err := bus.Connect(n.URL(), "producer", log.Named("producer"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	cfg := cpConfig()
	for _, fn := range tune {
		fn(&cfg)
	}
	f := &fleet{t: t, nats: n, conn: conn, log: log, cfg: cfg}
	f.cp = f.startCP()
	return f
}

func (f *fleet) startCP() *part {
	f.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	conn, err := bus.Connect(f.nats.URL(), "cp", f.log.Named("cp"))
	if err != nil {
		f.t.Fatal(err)
	}
	cp, err := controlplane.New(ctx, conn, f.cfg, f.log.Named("cp"))
	if err != nil {
		f.t.Fatal(err)
	}
	f.plane = cp
	p := newPart(cancel, func() error { defer conn.Close(); return cp.Run(ctx) })
	select {
	case <-cp.Ready():
	case <-p.done:
		f.t.Fatalf("control plane stopped: %v", p.err)
	case <-time.After(60 * time.Second):
		f.t.Fatal("control plane not ready in 60s")
	}
	f.t.Cleanup(func() { p.stop(f.t) })
	return p
}

// agentSpec describes one agent process to start.
type agentSpec struct {
	id         string
	world      world
	dataDir    string
	token      string
	generation uint64
	faults     *agent.Faults
	counts     *counts // shared across restarts of one node, to count effects
	noWait     bool    // do not wait for enrollment (it is expected to fail)
	// progressInterval overrides how often an image transfer is reported.
	progressInterval time.Duration
	// accelerator states the node's cards; cdiDirs are the CDI spec
	// directories its runtime resolves devices from.
	accelerator agent.AcceleratorProbe
	cdiDirs     []string
	// logRate and logBurst set the per-Run output limit (agent defaults
	// when zero).
	logRate, logBurst int64
	// networkModes are the modes the agent offers (the agent's default,
	// host excluded, when nil).
	networkModes []string
}

// node is one running agent process.
type node struct {
	spec  agentSpec
	agent *agent.Agent
	part  *part
}

// cacheFile is file in the node's cache name of no compatibility key, the
// same file a Run sees at that cache's mount.
func (n *node) cacheFile(name, file string) string {
	return filepath.Join(n.spec.dataDir, "caches", name, "_", file)
}

func (f *fleet) startAgent(spec agentSpec) *node {
	f.t.Helper()
	if spec.generation == 0 {
		spec.generation = 1
	}
	if spec.dataDir == "" {
		spec.dataDir = tempDir(f.t)
	}
	if spec.counts == nil {
		spec.counts = &counts{}
	}
	ctx, cancel := context.WithCancel(context.Background())
	opts := spec.world.runtimeOptions(spec.dataDir, f.log.Named(spec.id))
	opts.CDISpecDirs = spec.cdiDirs
	rt, err := containerd.New(ctx, opts)
	if err != nil {
		f.t.Fatal(err)
	}
	conn, err := bus.Connect(f.nats.URL(), spec.id, f.log.Named(spec.id))
	if err != nil {
		f.t.Fatal(err)
	}
	a, err := agent.New(agent.Config{NodeID: spec.id, Generation: spec.generation, EnrollmentToken: spec.token, DataDir: spec.dataDir,
		StopGrace: 2 * time.Second, Faults: spec.faults, ProgressInterval: spec.progressInterval, Accelerator: spec.accelerator,
		LogRate: spec.logRate, LogBurst: spec.logBurst, NetworkModes: spec.networkModes},
		conn, &countingRuntime{Runtime: rt, c: spec.counts}, f.log.Named(spec.id))
	if err != nil {
		f.t.Fatal(err)
	}
	p := newPart(cancel, func() error {
		defer func() { conn.Close(); _ = rt.Close() }()
		return a.Run(ctx)
	})
	n := &node{spec: spec, agent: a, part: p}
	f.t.Cleanup(func() { p.stop(f.t) })
	if !spec.noWait {
		f.waitNode(spec.id, a)
	}
	return n
}

// waitNode waits until the agent holds a session the registry agrees with.
func (f *fleet) waitNode(id string, a *agent.Agent) {
	f.t.Helper()
	kv, err := f.conn.JS.KeyValue(context.Background(), bus.BucketNodes)
	if err != nil {
		f.t.Fatal(err)
	}
	f.eventually(60*time.Second, "node "+id+" enrolled", func() bool {
		var rec schemas.NodeRecord
		_, err := bus.GetJSON(context.Background(), kv, id, &rec)
		return err == nil && rec.FencingToken != 0 && rec.FencingToken == a.Enrollment().FencingToken
	})
}

func (f *fleet) eventually(within time.Duration, what string, cond func() bool) {
	f.t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			f.t.Fatalf("timed out after %s waiting for %s", within, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// publishJSON publishes a body the way `nats pub` does: no Nats-Msg-Id
// unless given, JSON detected from the leading brace.
func (f *fleet) publish(subject string, body []byte, msgID string) {
	f.t.Helper()
	m := &nats.Msg{Subject: subject, Data: body, Header: nats.Header{}}
	var opts []jetstream.PublishOpt
	if msgID != "" {
		opts = append(opts, jetstream.WithMsgID(msgID))
	}
	if _, err := f.conn.JS.PublishMsg(context.Background(), m, opts...); err != nil {
		f.t.Fatalf("publish %s: %v", subject, err)
	}
}

func (f *fleet) submit(req schemas.RunRequest) string {
	f.t.Helper()
	b, err := json.Marshal(req)
	if err != nil {
		f.t.Fatal(err)
	}
	f.publish(bus.SubmitSubject(schemas.DefaultTenant, bus.OperatorUser), b, req.RequestID)
	return schemas.RunIDFor(schemas.DefaultTenant, req.RequestID)
}

func (f *fleet) run(id string) (schemas.Run, bool) {
	kv, err := f.conn.JS.KeyValue(context.Background(), bus.BucketRuns)
	if err != nil {
		f.t.Fatal(err)
	}
	var r schemas.Run
	_, err = bus.GetJSON(context.Background(), kv, id, &r)
	return r, err == nil
}

// waitPhase waits until the Run is in phase (or any terminal phase when
// phase is "") and returns it.
func (f *fleet) waitPhase(id string, phase schemas.Phase, within time.Duration) schemas.Run {
	f.t.Helper()
	var r schemas.Run
	f.eventually(within, "run "+id+" to reach "+string(phase), func() bool {
		var ok bool
		r, ok = f.run(id)
		if !ok {
			return false
		}
		if phase == "" {
			return r.Phase.Terminal()
		}
		return r.Phase == phase || (r.Phase.Terminal() && r.Phase != phase && f.failNow(r, phase))
	})
	return r
}

func (f *fleet) failNow(r schemas.Run, want schemas.Phase) bool {
	f.t.Helper()
	exit := "none"
	if r.ExitCode != nil {
		exit = strconv.Itoa(*r.ExitCode)
	}
	f.t.Fatalf("run %s (request %s) ended %s (reason %q, exit code %s) while waiting for %s", r.ID, r.Request.RequestID, r.Phase, r.Reason, exit, want)
	return false
}

// events reads a Run's whole event log once it holds every event the Run's
// record counts: a change is stored in wf_runs first and its events are
// published to WF_EVENTS after, so a test that saw the record change must
// wait for its events.
func (f *fleet) events(runID string) []schemas.RunEvent {
	f.t.Helper()
	r, ok := f.run(runID)
	var out []schemas.RunEvent
	f.eventually(30*time.Second, "WF_EVENTS to hold the events run "+runID+"'s record counts", func() bool {
		out = f.storedEvents(runID)
		return !ok || holdsSeqs(out, r.EventSeq)
	})
	return out
}

// holdsSeqs reports whether evs hold a Run's events 1..n (in any order;
// a rejection on the Run's subject has no seq).
func holdsSeqs(evs []schemas.RunEvent, n uint64) bool {
	seen := make(map[uint64]bool, len(evs))
	for _, ev := range evs {
		seen[ev.Seq] = true
	}
	for seq := uint64(1); seq <= n; seq++ {
		if !seen[seq] {
			return false
		}
	}
	return true
}

// storedEvents reads what WF_EVENTS holds for a Run now, whichever
// tenant's it is (Run ids differ across tenants).
func (f *fleet) storedEvents(runID string) []schemas.RunEvent {
	return f.eventsOn(bus.RunEventsSubject("*", runID))
}

// eventsOn reads every event WF_EVENTS holds now on subject, in stream
// order.
func (f *fleet) eventsOn(subject string) []schemas.RunEvent {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := f.conn.JS.Stream(ctx, bus.StreamEvents)
	if err != nil {
		f.t.Fatal(err)
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		f.t.Fatal(err)
	}
	want := 0
	for _, n := range info.State.Subjects {
		want += int(n)
	}
	var out []schemas.RunEvent
	if want == 0 {
		return out
	}
	c, err := f.conn.JS.OrderedConsumer(ctx, bus.StreamEvents, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}})
	if err != nil {
		f.t.Fatal(err)
	}
	for len(out) < want {
		batch, err := c.Fetch(min(want-len(out), 500), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			f.t.Fatalf("read events on %s: %v", subject, err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			var ev schemas.RunEvent
			if err := codec.Decode(codec.Detect(m.Headers(), m.Data()), m.Data(), &ev); err != nil {
				f.t.Fatalf("decode event: %v", err)
			}
			out = append(out, ev)
		}
		if err := batch.Error(); err != nil || n == 0 {
			f.t.Fatalf("read events on %s: %d of %d read (%v)", subject, len(out), want, err)
		}
	}
	return out
}

// world is a containerd plus an image dir holding one busybox image, and
// a bridge network of its own that its agents' Runs join.
type world struct {
	ctrd     *testenv.Containerd
	imageDir string
	image    testenv.Image
	bridge   testenv.Bridge
	// ipamDir holds the bridge's address leases, shared by the world's
	// agents as agents sharing a bridge must.
	ipamDir string
	// stateRoot holds the runtime state of the world's agents, one dir per
	// agent data dir. It outlives the agents' data dirs, so the sweep at the
	// world's end still finds what the runtimes recorded.
	stateRoot string
	// resolvConf, when set, is the file the agents' runtimes copy into
	// Runs as /etc/resolv.conf.
	resolvConf string
}

var imageOnce sync.Mutex

func newWorld(t *testing.T, opts ...testenv.ContainerdOption) world {
	t.Helper()
	ctrd := testenv.StartContainerd(t, opts...)
	bridge := testenv.NewBridge(t)
	dir := t.TempDir()
	imageOnce.Lock()
	defer imageOnce.Unlock()
	img := testenv.BuildBusyboxImage(t, dir, "busybox")
	w := world{ctrd: ctrd, imageDir: dir, image: img, bridge: bridge, ipamDir: tempDir(t), stateRoot: tempDir(t)}
	// After the agents (their cleanups run first), before containerd stops.
	t.Cleanup(func() { w.sweep(t) })
	return w
}

// sweep removes every workload the world's agents left, through a runtime
// over each agent's state, so no namespace, veth, lease or masquerade rule
// outlives the test: the runtime's start releases what belongs to
// workloads already gone, and Remove the rest.
func (w world) sweep(t *testing.T) {
	dirs, err := os.ReadDir(w.stateRoot)
	if err != nil {
		t.Logf("sweep: %v", err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, d := range dirs {
		dir := filepath.Join(w.stateRoot, d.Name())
		opts := w.runtimeOptions("", zap.NewNop())
		opts.LogDir, opts.StateDir = filepath.Join(dir, "sweep-logs"), dir
		rt, err := containerd.New(ctx, opts)
		if err != nil {
			t.Logf("sweep %s: %v", dir, err)
			continue
		}
		list, err := rt.List(ctx)
		if err != nil {
			t.Logf("sweep %s: %v", dir, err)
		}
		for _, st := range list {
			if err := rt.Remove(ctx, st.ID); err != nil {
				t.Logf("sweep %s: %v", dir, err)
			}
		}
		_ = rt.Close()
	}
}

// runtimeOptions are the containerd runtime options of an agent of w whose
// files live in dataDir: logs in it, runtime state of its own (the same
// for every start with that data dir), w's bridge.
func (w world) runtimeOptions(dataDir string, log *zap.Logger) containerd.Options {
	sum := sha256.Sum256([]byte(dataDir))
	return containerd.Options{Address: w.ctrd.Address, Namespace: w.ctrd.Namespace, ImageDir: w.imageDir,
		LogDir: filepath.Join(dataDir, "logs"), StateDir: filepath.Join(w.stateRoot, hex.EncodeToString(sum[:8])),
		Network: containerd.NetworkOptions{Bridge: w.bridge.Name, Subnet: w.bridge.Subnet, IPAMDir: w.ipamDir, ResolvConf: w.resolvConf}, Logger: log}
}

func tempDir(t *testing.T) string {
	d, err := os.MkdirTemp("", "wfagent")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(d) })
	return d
}

// allEvents reads every event in WF_EVENTS, in stream order.
func (f *fleet) allEvents() []schemas.RunEvent {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := f.conn.JS.Stream(ctx, bus.StreamEvents)
	if err != nil {
		f.t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		f.t.Fatal(err)
	}
	var out []schemas.RunEvent
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			continue
		}
		var ev schemas.RunEvent
		if codec.Decode(codec.Detect(m.Header, m.Data), m.Data, &ev) == nil {
			out = append(out, ev)
		}
	}
	return out
}

// waitImageHot waits until node's facts list the image pinned by
// manifestDigest hot.
func (f *fleet) waitImageHot(node, manifestDigest string, within time.Duration) {
	f.t.Helper()
	f.eventually(within, node+"'s facts to list image "+manifestDigest+" hot", func() bool {
		rec := f.nodeRecord(node)
		if rec.Facts == nil {
			return false
		}
		for _, im := range rec.Facts.Images {
			if im.ManifestDigest == manifestDigest && im.State == schemas.LocalityHot {
				return true
			}
		}
		return false
	})
}

// waitHandled waits until the work-queue stream holds nothing on subject
// (anything when subject is ""): every message published there so far was
// handled and acknowledged, which removes it.
func (f *fleet) waitHandled(stream, subject string, within time.Duration) {
	f.t.Helper()
	f.eventually(within, stream+" to hold nothing unhandled on "+subject, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s, err := f.conn.JS.Stream(ctx, stream)
		if err != nil {
			return false
		}
		if subject == "" {
			info, err := s.Info(ctx)
			return err == nil && info.State.Msgs == 0
		}
		info, err := s.Info(ctx, jetstream.WithSubjectFilter(subject))
		return err == nil && info.State.Subjects[subject] == 0
	})
}

// observations holds what a node publishes on its observation subject from
// when it was made (a core subscription sees what the agent publishes into
// WF_OBS).
type observations struct {
	mu  sync.Mutex
	all []schemas.Observation
}

// has reports whether one of the observations satisfies match.
func (o *observations) has(match func(schemas.Observation) bool) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.ContainsFunc(o.all, match)
}

func (f *fleet) watchObservations(nodeID string) *observations {
	f.t.Helper()
	o := &observations{}
	sub, err := f.conn.NC.Subscribe(bus.NodeObs(nodeID), func(m *nats.Msg) {
		var ob schemas.Observation
		if codec.Decode(codec.Detect(m.Header, m.Data), m.Data, &ob) == nil {
			o.mu.Lock()
			o.all = append(o.all, ob)
			o.mu.Unlock()
		}
	})
	if err != nil {
		f.t.Fatal(err)
	}
	if err := f.conn.NC.Flush(); err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { _ = sub.Unsubscribe() })
	return o
}
