package metrics_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/warmfleet/warmfleet/internal/metrics"
	"github.com/warmfleet/warmfleet/schemas"
)

// scrape GETs /metrics and parses the text exposition.
func scrape(t *testing.T, base string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET /metrics: %s: %s", resp.Status, b)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return fams
}

// value returns the value of the one series of name whose labels include
// want, failing t when there is none.
func value(t *testing.T, fams map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	t.Helper()
	f, ok := fams[name]
	if !ok {
		t.Fatalf("metric %s missing", name)
	}
next:
	for _, m := range f.GetMetric() {
		got := map[string]string{}
		for _, l := range m.GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if got[k] != v {
				continue next
			}
		}
		switch f.GetType() {
		case dto.MetricType_COUNTER:
			return m.GetCounter().GetValue()
		case dto.MetricType_GAUGE:
			return m.GetGauge().GetValue()
		default:
			t.Fatalf("metric %s has type %s", name, f.GetType())
		}
	}
	t.Fatalf("metric %s has no series with labels %v", name, want)
	return 0
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// fakeCP is a control plane whose snapshot the test moves.
type fakeCP struct {
	mu sync.Mutex
	m  metrics.ControlPlane
}

func (f *fakeCP) Metrics() metrics.ControlPlane { f.mu.Lock(); defer f.mu.Unlock(); return f.m }
func (f *fakeCP) set(m metrics.ControlPlane)    { f.mu.Lock(); defer f.mu.Unlock(); f.m = m }

func TestControlPlaneMetrics(t *testing.T) {
	cp := &fakeCP{}
	phases := map[schemas.Phase]int{schemas.PhaseRunning: 2, schemas.PhaseSucceeded: 5, "paused": 1}
	// Phase counts in a snapshot that is not synced yet are not reported.
	cp.set(metrics.ControlPlane{Transitions: 11, FencedObservations: 2, Rejected: 3, StaleReports: 4, LeaseLapses: 5,
		CommandsSent: 6, PlacementMisses: 7, Decisions: 8, DecisionNanos: 2_500_000_000, PolicyReloadFailures: 9, Phases: phases})
	srv := httptest.NewServer(metrics.Handler(metrics.NewControlPlaneRegistry(cp.Metrics), nil))
	defer srv.Close()

	fams := scrape(t, srv.URL)
	for name, want := range map[string]float64{
		"warmfleet_controlplane_run_transitions_total":            11,
		"warmfleet_controlplane_fenced_observations_total":        2,
		"warmfleet_controlplane_rejected_requests_total":          3,
		"warmfleet_controlplane_stale_reports_total":              4,
		"warmfleet_controlplane_lease_lapses_total":               5,
		"warmfleet_controlplane_commands_sent_total":              6,
		"warmfleet_controlplane_placement_misses_total":           7,
		"warmfleet_controlplane_placement_decisions_total":        8,
		"warmfleet_controlplane_placement_decision_seconds_total": 2.5,
		"warmfleet_policy_reload_failures_total":                  9,
	} {
		if fams[name].GetType() != dto.MetricType_COUNTER {
			t.Errorf("%s: type %s, want counter", name, fams[name].GetType())
		}
		if got := value(t, fams, name, nil); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	for _, name := range []string{"go_goroutines", "process_cpu_seconds_total", "process_resident_memory_bytes"} {
		if _, ok := fams[name]; !ok {
			t.Errorf("%s missing: the process and Go collectors are registered", name)
		}
	}
	if _, ok := fams["warmfleet_runs"]; ok {
		t.Error("warmfleet_runs reported before the phase counts synced")
	}

	// Read at scrape time: a moved snapshot shows at the next scrape.
	cp.set(metrics.ControlPlane{Transitions: 12, Decisions: 9, DecisionNanos: 3_000_000_000, Phases: phases, PhasesSynced: true})
	fams = scrape(t, srv.URL)
	if got := value(t, fams, "warmfleet_controlplane_run_transitions_total", nil); got != 12 {
		t.Errorf("transitions after move = %v, want 12", got)
	}
	if got := value(t, fams, "warmfleet_controlplane_placement_decision_seconds_total", nil); got != 3 {
		t.Errorf("decision seconds after move = %v, want 3", got)
	}
	if fams["warmfleet_runs"].GetType() != dto.MetricType_GAUGE {
		t.Errorf("warmfleet_runs type %s, want gauge", fams["warmfleet_runs"].GetType())
	}
	for phase, want := range map[string]float64{"running": 2, "succeeded": 5, "accepted": 0, "lost": 0, "paused": 1} {
		if got := value(t, fams, "warmfleet_runs", map[string]string{"phase": phase}); got != want {
			t.Errorf("warmfleet_runs{phase=%q} = %v, want %v", phase, got, want)
		}
	}
	if n := len(fams["warmfleet_runs"].GetMetric()); n != len(metrics.Phases)+1 {
		t.Errorf("warmfleet_runs has %d series, want one per phase (%d) plus the unknown one", n, len(metrics.Phases)+1)
	}

	// The counts move with the snapshot too.
	cp.set(metrics.ControlPlane{Phases: map[schemas.Phase]int{schemas.PhaseRunning: 1, schemas.PhaseFailed: 3}, PhasesSynced: true})
	fams = scrape(t, srv.URL)
	for phase, want := range map[string]float64{"running": 1, "failed": 3, "succeeded": 0} {
		if got := value(t, fams, "warmfleet_runs", map[string]string{"phase": phase}); got != want {
			t.Errorf("warmfleet_runs{phase=%q} after move = %v, want %v", phase, got, want)
		}
	}
	if n := len(fams["warmfleet_runs"].GetMetric()); n != len(metrics.Phases) {
		t.Errorf("warmfleet_runs has %d series after the unknown phase went, want %d", n, len(metrics.Phases))
	}
}

// TestControlPlaneRunsWhenEmpty: a synced snapshot with no Runs (nil or
// empty counts) reports every phase as zero; the zero snapshot reports no
// Runs gauge at all.
func TestControlPlaneRunsWhenEmpty(t *testing.T) {
	cp := &fakeCP{}
	srv := httptest.NewServer(metrics.Handler(metrics.NewControlPlaneRegistry(cp.Metrics), nil))
	defer srv.Close()
	fams := scrape(t, srv.URL)
	if got := value(t, fams, "warmfleet_controlplane_placement_decisions_total", nil); got != 0 {
		t.Errorf("decisions = %v, want 0", got)
	}
	if _, ok := fams["warmfleet_runs"]; ok {
		t.Error("warmfleet_runs reported from the zero snapshot")
	}
	for _, counts := range []map[schemas.Phase]int{nil, {}} {
		cp.set(metrics.ControlPlane{Phases: counts, PhasesSynced: true})
		fams = scrape(t, srv.URL)
		if n := len(fams["warmfleet_runs"].GetMetric()); n != len(metrics.Phases) {
			t.Errorf("counts %v: warmfleet_runs has %d series, want %d", counts, n, len(metrics.Phases))
		}
		for _, p := range metrics.Phases {
			if got := value(t, fams, "warmfleet_runs", map[string]string{"phase": string(p)}); got != 0 {
				t.Errorf("counts %v: warmfleet_runs{phase=%q} = %v, want 0", counts, p, got)
			}
		}
	}
}

func TestHealthAndReadiness(t *testing.T) {
	var ready atomic.Bool
	srv := httptest.NewServer(metrics.Handler(metrics.NewControlPlaneRegistry((&fakeCP{}).Metrics), ready.Load))
	defer srv.Close()

	if code, body := get(t, srv.URL+"/healthz"); code != http.StatusOK || body != "ok\n" {
		t.Errorf("/healthz before ready: %d %q", code, body)
	}
	if code, body := get(t, srv.URL+"/readyz"); code != http.StatusServiceUnavailable || body != "not ready\n" {
		t.Errorf("/readyz before ready: %d %q, want 503", code, body)
	}
	ready.Store(true)
	if code, body := get(t, srv.URL+"/readyz"); code != http.StatusOK || body != "ready\n" {
		t.Errorf("/readyz when ready: %d %q, want 200", code, body)
	}
	ready.Store(false) // readiness can be lost again (e.g. NATS gone)
	if code, _ := get(t, srv.URL+"/readyz"); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz after losing readiness: %d, want 503", code)
	}
	if code, _ := get(t, srv.URL+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz while not ready: %d, want 200", code)
	}
	if code, _ := get(t, srv.URL+"/nope"); code != http.StatusNotFound {
		t.Errorf("/nope: %d, want 404", code)
	}
	resp, err := http.Post(srv.URL+"/metrics", "text/plain", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /metrics: %d, want 405", resp.StatusCode)
	}
}

func TestAgentMetrics(t *testing.T) {
	var mu sync.Mutex
	var enr schemas.Enrollment
	enrollment := func() schemas.Enrollment { mu.Lock(); defer mu.Unlock(); return enr }
	ready := func() bool { return metrics.Enrolled(enrollment()) }
	srv := httptest.NewServer(metrics.Handler(metrics.NewAgentRegistry("gpu-7", enrollment), ready))
	defer srv.Close()

	node := map[string]string{"node_id": "gpu-7"}
	fams := scrape(t, srv.URL)
	if got := value(t, fams, "warmfleet_agent_enrolled", node); got != 0 {
		t.Errorf("enrolled before enrolling = %v", got)
	}
	if got := value(t, fams, "warmfleet_agent_fencing_token", node); got != 0 {
		t.Errorf("fencing token before enrolling = %v", got)
	}
	if _, ok := fams["warmfleet_agent_session_expiry_timestamp_seconds"]; ok {
		t.Error("session expiry reported before enrolling")
	}
	if _, ok := fams["go_goroutines"]; !ok {
		t.Error("go_goroutines missing")
	}
	if code, _ := get(t, srv.URL+"/readyz"); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz before enrolling: %d, want 503", code)
	}

	exp := time.Unix(1_900_000_000, 500_000_000)
	mu.Lock()
	enr = schemas.Enrollment{NodeID: "gpu-7", FencingToken: 42, Generation: 3, SessionExpires: exp}
	mu.Unlock()
	fams = scrape(t, srv.URL)
	for name, want := range map[string]float64{
		"warmfleet_agent_enrolled":                         1,
		"warmfleet_agent_fencing_token":                    42,
		"warmfleet_agent_generation":                       3,
		"warmfleet_agent_session_expiry_timestamp_seconds": 1_900_000_000.5,
	} {
		if got := value(t, fams, name, node); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	if code, _ := get(t, srv.URL+"/readyz"); code != http.StatusOK {
		t.Errorf("/readyz once enrolled: %d, want 200", code)
	}
}

func TestServeStopsWithContext(t *testing.T) {
	ln, err := metrics.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- metrics.ServeListener(ctx, ln, metrics.NewAgentRegistry("n", func() schemas.Enrollment { return schemas.Enrollment{} }), nil)
	}()

	if code, _ := get(t, "http://"+addr+"/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz: %d", code)
	}
	scrape(t, "http://"+addr)

	// The port is taken: a second Serve on it fails at once.
	if err := metrics.Serve(context.Background(), addr, metrics.NewAgentRegistry("n", func() schemas.Enrollment { return schemas.Enrollment{} }), nil); err == nil || !strings.Contains(err.Error(), "listen on "+addr) {
		t.Errorf("Serve on a taken port: %v, want a listen error", err)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("ServeListener after cancel: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ServeListener did not return within 10s of its context ending")
	}
	c := http.Client{Timeout: 2 * time.Second}
	if resp, err := c.Get("http://" + addr + "/healthz"); err == nil {
		resp.Body.Close()
		t.Fatal("server still answers after shutdown")
	} else if errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("server hangs after shutdown: %v", err)
	}
}
