package agent

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap/zaptest"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/internal/noopruntime"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/noderuntime"
	"github.com/warmfleet/warmfleet/schemas"
)

// faultyRuntime is the noop runtime with EnsureImage and Launch made to
// fail on demand: the runtime is not what these tests test.
type faultyRuntime struct {
	*noopruntime.Runtime
	mu                   sync.Mutex
	ensureErr, launchErr error
}

func (r *faultyRuntime) set(ensureErr, launchErr error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ensureErr, r.launchErr = ensureErr, launchErr
}

func (r *faultyRuntime) EnsureImage(ctx context.Context, spec noderuntime.ImageSpec) (noderuntime.ImageResult, error) {
	r.mu.Lock()
	err := r.ensureErr
	r.mu.Unlock()
	if err != nil {
		return noderuntime.ImageResult{}, err
	}
	return r.Runtime.EnsureImage(ctx, spec)
}

func (r *faultyRuntime) Launch(ctx context.Context, spec noderuntime.WorkloadSpec) (noderuntime.WorkloadStatus, error) {
	r.mu.Lock()
	err := r.launchErr
	r.mu.Unlock()
	if err != nil {
		return noderuntime.WorkloadStatus{}, err
	}
	return r.Runtime.Launch(ctx, spec)
}

// launchBench is an agent on a real NATS with its streams, the workload
// reports it publishes collected by attempt.
type launchBench struct {
	a   *Agent
	rt  *faultyRuntime
	ctx context.Context

	mu      sync.Mutex
	reports map[string][]schemas.WorkloadObservation
}

func newLaunchBench(t *testing.T, cfg Config) *launchBench {
	t.Helper()
	n := testenv.StartNATS(t)
	conn, err := bus.Connect(n.URL(), "agent-launch-test", zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	ctx, cancel := context.WithCancel(context.Background())
	if err := bus.Provision(ctx, conn.JS, bus.Topology{}); err != nil {
		t.Fatal(err)
	}
	b := &launchBench{rt: &faultyRuntime{Runtime: noopruntime.New(noopruntime.Options{})}, ctx: ctx, reports: map[string][]schemas.WorkloadObservation{}}
	cfg.NodeID, cfg.DataDir = "node-launch", t.TempDir()
	sub, err := conn.NC.Subscribe(bus.NodeObs(cfg.NodeID), func(m *nats.Msg) {
		var o schemas.Observation
		if err := codec.Decode(codec.Detect(m.Header, m.Data), m.Data, &o); err != nil || o.Workload == nil {
			return
		}
		b.mu.Lock()
		defer b.mu.Unlock()
		b.reports[o.Workload.AttemptID] = append(b.reports[o.Workload.AttemptID], *o.Workload)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	b.a, err = New(cfg, conn, b.rt, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		b.a.wg.Wait()
		_ = b.a.journal.Close()
	})
	return b
}

// reportsIn waits for an attempt's first report in phase, then a moment
// more for a second one, and returns them.
func (b *launchBench) reportsIn(attempt string, phase schemas.WorkloadPhase) []schemas.WorkloadObservation {
	count := func() []schemas.WorkloadObservation {
		b.mu.Lock()
		defer b.mu.Unlock()
		var out []schemas.WorkloadObservation
		for _, w := range b.reports[attempt] {
			if w.Phase == phase {
				out = append(out, w)
			}
		}
		return out
	}
	for deadline := time.Now().Add(5 * time.Second); len(count()) == 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond)
	return count()
}

func launchCmd(attempt string) schemas.Command {
	return schemas.Command{OperationID: attempt + ".launch", NodeID: "node-launch", Kind: schemas.CmdLaunchWorkload,
		Launch: &schemas.LaunchWorkload{RunID: "r-" + attempt, AttemptID: attempt, Reference: "example.com/app:1",
			ManifestDigest: "sha256:" + fmt.Sprintf("%064x", 7)}}
}

// Every way a launch can end without its workload ends the same way: one
// coded receipt, one failed report, the attempt's holdings let go, and no
// output directory left behind.
func TestLaunch_EveryFailureOnePath(t *testing.T) {
	b := newLaunchBench(t, Config{NetworkModes: []string{"bridge", "none"}})
	a := b.a
	// An artifact whose source serves other bytes than its digest names,
	// under a credential the control plane (this test) gives.
	src := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("0123456789")) }))
	t.Cleanup(src.Close)
	artifact := schemas.ArtifactMount{Name: "weights", Digest: "sha256:" + fmt.Sprintf("%064x", 9), SizeBytes: 10, Path: "/weights",
		Source: schemas.ArtifactSource{URL: src.URL + "/weights"}}
	credSub, err := a.conn.NC.Subscribe(bus.NodeArtifactCredentials("node-launch"), func(m *nats.Msg) {
		var req schemas.ArtifactCredentialRequest
		enc, _ := codec.DecodeMsg(m, &req)
		_ = bus.Respond(m, enc, schemas.Reply[schemas.ArtifactCredential]{OK: &schemas.ArtifactCredential{Digest: req.Digest}})
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = credSub.Unsubscribe() })
	for _, tc := range []struct {
		name       string
		setup      func(attempt string, l *schemas.LaunchWorkload)
		undo       func()
		outcome    string
		code       schemas.Code
		reason     string // the failed report's, when not the receipt's message
		stopReason string
	}{
		{name: "stopped before launch", setup: func(attempt string, l *schemas.LaunchWorkload) {
			a.attempts.prepared(attempt, l.ManifestDigest)
			if err := a.journal.Append(JournalEntry{OperationID: attempt + ".stop", Kind: schemas.CmdStopWorkload, AttemptID: attempt,
				Outcome: schemas.OutcomeApplied, StopReason: "cancelled"}); err != nil {
				t.Fatal(err)
			}
		}, outcome: schemas.OutcomeRefused, code: schemas.CodeCancelled, reason: "stopped before launch", stopReason: "cancelled"},
		{name: "preparation failed", setup: func(attempt string, l *schemas.LaunchWorkload) {
			a.attempts.prepared(attempt, l.ManifestDigest)
			a.attempts.failPrepare(attempt, schemas.CodeArtifactDigestMismatch, "wrong bytes")
		}, outcome: schemas.OutcomeFailed, code: schemas.CodeArtifactDigestMismatch},
		{name: "network not offered", setup: func(_ string, l *schemas.LaunchWorkload) { l.Network = "host" },
			outcome: schemas.OutcomeRefused, code: schemas.CodeNetworkUnavailable},
		{name: "invalid cache", setup: func(_ string, l *schemas.LaunchWorkload) {
			l.Caches = []schemas.CacheMount{{Name: "..", Path: "/cache"}}
		}, outcome: schemas.OutcomeRefused, code: schemas.CodeInvalidCache},
		{name: "artifact's bytes are not its digest's", setup: func(_ string, l *schemas.LaunchWorkload) {
			l.Artifacts = []schemas.ArtifactMount{artifact}
		}, outcome: schemas.OutcomeFailed, code: schemas.CodeArtifactDigestMismatch},
		{name: "image not ensured", setup: func(string, *schemas.LaunchWorkload) {
			b.rt.set(fmt.Errorf("pull: %w", noderuntime.ErrRegistryAuth), nil)
		}, undo: func() { b.rt.set(nil, nil) }, outcome: schemas.OutcomeFailed, code: schemas.CodeRegistryAuthFailed},
		{name: "output dir", setup: func(string, *schemas.LaunchWorkload) {
			if err := os.WriteFile(filepath.Join(a.cfg.DataDir, "output"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}, undo: func() { _ = os.Remove(filepath.Join(a.cfg.DataDir, "output")) }, outcome: schemas.OutcomeFailed, code: schemas.CodeLaunchFailed},
		{name: "runtime refuses the launch", setup: func(string, *schemas.LaunchWorkload) {
			b.rt.set(nil, errors.New("runc: no such device"))
		}, undo: func() { b.rt.set(nil, nil) }, outcome: schemas.OutcomeFailed, code: schemas.CodeLaunchFailed},
		{name: "image gone since its prepare and not found again", setup: func(attempt string, l *schemas.LaunchWorkload) {
			a.attempts.prepared(attempt, l.ManifestDigest)
			b.rt.set(noderuntime.ErrImageNotFound, noderuntime.ErrImageNotFound)
		}, undo: func() { b.rt.set(nil, nil) }, outcome: schemas.OutcomeFailed, code: schemas.CodeLaunchFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			attempt := fmt.Sprintf("att-%d", time.Now().UnixNano())
			c := launchCmd(attempt)
			tc.setup(attempt, c.Launch)
			if tc.undo != nil {
				defer tc.undo()
			}
			var rc schemas.OperationReceipt
			a.applyLaunch(b.ctx, c, &rc)
			if rc.Outcome != tc.outcome || rc.Code != tc.code || rc.Message == "" || rc.Duplicate {
				t.Fatalf("receipt %+v, want %s with %s", rc, tc.outcome, tc.code)
			}
			reports := b.reportsIn(attempt, schemas.WorkloadFailed)
			if len(reports) != 1 {
				t.Fatalf("%d failed reports, want one: %+v", len(reports), reports)
			}
			w, wantReason := reports[0], tc.reason
			if wantReason == "" {
				wantReason = rc.Message
			}
			if w.RunID != c.Launch.RunID || w.FailureReason != wantReason || w.StopReason != tc.stopReason {
				t.Errorf("report %+v, want reason %q and stop reason %q", w, wantReason, tc.stopReason)
			}
			if wantCode := tc.code; wantCode != schemas.CodeLaunchFailed && w.FailureCode != wantCode {
				t.Errorf("report's code %q, want %q", w.FailureCode, wantCode)
			}
			if _, held := holdingOf(a.attempts, attempt); held {
				t.Error("the failed attempt still holds what it prepared or mounted")
			}
			if _, err := os.Stat(a.output.Dir(attempt)); err == nil {
				t.Error("the output dir of a launch that never started is left")
			}
			if _, launches := b.rt.Counts(); launches != 0 {
				t.Errorf("%d workloads launched", launches)
			}
		})
	}
}

// A launch that starts its workload reports no failure, keeps what its
// attempt holds until the workload is removed, and a repeat of it finds
// the workload and changes nothing.
func TestLaunch_StartsAndHolds(t *testing.T) {
	b := newLaunchBench(t, Config{})
	a := b.a
	c := launchCmd("att-ok")
	c.Launch.GPUs = []string{"GPU-1"}
	a.attempts.prepared("att-ok", c.Launch.ManifestDigest)
	var rc schemas.OperationReceipt
	a.applyLaunch(b.ctx, c, &rc)
	if rc.Outcome != schemas.OutcomeApplied || rc.Duplicate || rc.Code != "" {
		t.Fatalf("receipt %+v, want applied", rc)
	}
	if h, ok := holdingOf(a.attempts, "att-ok"); !ok || h.Image != c.Launch.ManifestDigest {
		t.Errorf("the launched attempt holds %+v", h)
	}
	if _, err := os.Stat(a.output.Dir("att-ok")); err != nil {
		t.Errorf("the started workload's output dir: %v", err)
	}
	st, err := b.rt.Inspect(b.ctx, "att-ok")
	if err != nil || st.Labels[LabelGPUs] != "GPU-1" || st.Labels[LabelRunID] != "r-att-ok" {
		t.Fatalf("workload %+v: %v", st, err)
	}
	var again schemas.OperationReceipt
	a.applyLaunch(b.ctx, c, &again)
	if again.Outcome != schemas.OutcomeApplied || !again.Duplicate {
		t.Fatalf("repeat's receipt %+v, want a duplicate applied", again)
	}
	if got := b.reportsIn("att-ok", schemas.WorkloadRunning); len(got) != 1 {
		t.Errorf("%d running reports, want one: %+v", len(got), got)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, w := range b.reports["att-ok"] {
		if w.Phase == schemas.WorkloadFailed {
			t.Errorf("a failed report of a launch that started: %+v", w)
		}
	}
}

// A launch reports starting only when no prepare of its attempt reported
// prepared (which moved the Run to launching already): a prepared
// attempt's launch goes from its receipt to running with no report between.
func TestLaunch_StartingOnlyWithoutPrepare(t *testing.T) {
	b := newLaunchBench(t, Config{})
	prepared, bare := launchCmd("att-prepared"), launchCmd("att-bare")
	b.a.attempts.prepared("att-prepared", prepared.Launch.ManifestDigest)
	for _, c := range []schemas.Command{prepared, bare} {
		var rc schemas.OperationReceipt
		b.a.applyLaunch(b.ctx, c, &rc)
		if rc.Outcome != schemas.OutcomeApplied {
			t.Fatalf("%s: receipt %+v, want applied", c.Launch.AttemptID, rc)
		}
	}
	if got := b.reportsIn("att-bare", schemas.WorkloadStarting); len(got) != 1 {
		t.Errorf("unprepared launch: %d starting reports, want one", len(got))
	}
	if got := b.reportsIn("att-prepared", schemas.WorkloadRunning); len(got) != 1 {
		t.Fatalf("prepared launch: %d running reports, want one", len(got))
	}
	if got := b.reportsIn("att-prepared", schemas.WorkloadStarting); len(got) != 0 {
		t.Errorf("prepared launch reported starting %d times, want none: %+v", len(got), got)
	}
}
