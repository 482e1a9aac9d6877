package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/agent"
	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/controlplane"
	"github.com/warmfleet/warmfleet/schemas"
)

func invitedOnly(c *controlplane.Config) { c.OpenEnrollment = false }

// invite mints a bootstrap the way `warmfleet node invite` does.
func (f *fleet) invite(nodeID string, generation uint64, ttl time.Duration) schemas.NodeBootstrap {
	f.t.Helper()
	b, _ := json.Marshal(schemas.InviteRequest{NodeID: nodeID, Generation: generation, TTLSeconds: int64(ttl / time.Second)})
	resp, err := f.conn.NC.Request(bus.SubjectInvite, b, 5*time.Second)
	if err != nil {
		f.t.Fatalf("invite: %v", err)
	}
	var rep schemas.Reply[schemas.NodeBootstrap]
	if err := json.Unmarshal(resp.Data, &rep); err != nil || rep.OK == nil {
		f.t.Fatalf("invite: %v %+v", err, rep.Refusal)
	}
	return *rep.OK
}

// enroll sends one raw enrollment request body and returns the reply.
func (f *fleet) enrollRaw(body []byte) schemas.Reply[schemas.Enrollment] {
	f.t.Helper()
	resp, err := f.conn.NC.Request(bus.SubjectEnroll, body, 5*time.Second)
	if err != nil {
		f.t.Fatalf("enroll: %v", err)
	}
	var rep schemas.Reply[schemas.Enrollment]
	if err := codec.Decode(codec.Detect(resp.Header, resp.Data), resp.Data, &rep); err != nil {
		f.t.Fatalf("enroll reply: %v", err)
	}
	return rep
}

// nodesSnapshot is every wf_nodes key with its revision.
func (f *fleet) nodesSnapshot() map[string]uint64 {
	f.t.Helper()
	kv, err := f.conn.JS.KeyValue(context.Background(), bus.BucketNodes)
	if err != nil {
		f.t.Fatal(err)
	}
	out := map[string]uint64{}
	keys, err := kv.ListKeys(context.Background())
	if err != nil {
		f.t.Fatal(err)
	}
	for k := range keys.Keys() {
		e, err := kv.Get(context.Background(), k)
		if err == nil {
			out[k] = e.Revision()
		}
	}
	return out
}

func (f *fleet) nodeRecord(id string) schemas.NodeRecord {
	f.t.Helper()
	kv, err := f.conn.JS.KeyValue(context.Background(), bus.BucketNodes)
	if err != nil {
		f.t.Fatal(err)
	}
	var rec schemas.NodeRecord
	if _, err := bus.GetJSON(context.Background(), kv, id, &rec); err != nil {
		f.t.Fatalf("node %s: %v", id, err)
	}
	return rec
}

// TestAcceptance_EnrollmentRefusals: every bad credential is refused with its
// own code and leaves wf_nodes as it was.
func TestAcceptance_EnrollmentRefusals(t *testing.T) {
	f := newFleet(t, invitedOnly)
	good := f.invite("n1", 2, time.Minute)
	short := f.invite("n1", 2, time.Second)
	time.Sleep(1100 * time.Millisecond) // let `short` expire
	req := func(node string, gen uint64, token string) []byte {
		b, _ := json.Marshal(schemas.EnrollmentRequest{NodeID: node, Generation: gen, EnrollmentToken: token, AgentVersion: agent.Version})
		return b
	}
	unknown := strings.Repeat("A", 43)
	cases := []struct {
		name string
		body []byte
		code schemas.Code
	}{
		{"no token", req("n1", 2, ""), schemas.CodeTokenRequired},
		{"malformed token", req("n1", 2, "not-a-token"), schemas.CodeTokenMalformed},
		{"unknown token", req("n1", 2, unknown), schemas.CodeTokenUnknown},
		{"wrong node", req("n2", 2, good.EnrollmentToken), schemas.CodeWrongNode},
		{"wrong generation", req("n1", 3, good.EnrollmentToken), schemas.CodeStaleGeneration},
		{"expired token", req("n1", 2, short.EnrollmentToken), schemas.CodeTokenExpired},
		{"malformed body", []byte(`{"node_id": 5}`), schemas.CodeMalformed},
		{"unknown field", []byte(`{"node_id":"n1","generation":2,"root":true}`), schemas.CodeUnknownField},
	}
	before := f.nodesSnapshot()
	for _, c := range cases {
		rep := f.enrollRaw(c.body)
		if rep.OK != nil || rep.Refusal == nil || rep.Refusal.Code != c.code {
			t.Errorf("%s: got ok=%v refusal=%+v, want %s", c.name, rep.OK != nil, rep.Refusal, c.code)
		}
		if rep.Refusal != nil && strings.Contains(rep.Refusal.Error(), good.EnrollmentToken) {
			t.Errorf("%s: refusal echoes the token", c.name)
		}
		if after := f.nodesSnapshot(); fmt.Sprint(after) != fmt.Sprint(before) {
			t.Fatalf("%s changed wf_nodes: %v → %v", c.name, before, after)
		}
	}
	// The right token works once; its second use is refused.
	if rep := f.enrollRaw(req("n1", 2, good.EnrollmentToken)); rep.OK == nil || rep.OK.FencingToken != 1 || rep.OK.Duplicate {
		t.Fatalf("valid enrollment: %+v %+v", rep.OK, rep.Refusal)
	}
	before = f.nodesSnapshot()
	if rep := f.enrollRaw(req("n1", 2, good.EnrollmentToken)); rep.Refusal == nil || rep.Refusal.Code != schemas.CodeTokenUnknown {
		t.Fatalf("reused token: %+v", rep.Refusal)
	}
	if after := f.nodesSnapshot(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("reused token changed wf_nodes")
	}
	// An older generation than the node's is refused even with a fresh token.
	old := f.invite("n1", 1, time.Minute)
	if rep := f.enrollRaw(req("n1", 1, old.EnrollmentToken)); rep.Refusal == nil || rep.Refusal.Code != schemas.CodeStaleGeneration {
		t.Fatalf("older generation: %+v", rep.Refusal)
	}
	// No secret is at rest: the invitation bucket and the node record hold
	// hashes only.
	rec := f.nodeRecord("n1")
	if strings.Contains(fmt.Sprint(rec), good.EnrollmentToken) || !strings.HasPrefix(rec.SessionTokenHash, "sha256:") {
		t.Fatalf("node record holds a raw token: %+v", rec)
	}
}

// TestAcceptance_StaleSessionIsFenced: agent A holds node n1's session; agent
// B enrolls as n1 with a new invitation. From then on nothing A sends is
// applied, commands go to B, A stops itself, and a restarted A cannot
// enroll.
func TestAcceptance_StaleSessionIsFenced(t *testing.T) {
	wa, wb := newWorld(t), newWorld(t)
	f := newFleet(t, invitedOnly, func(c *controlplane.Config) { c.SessionTTL = 10 * time.Second })
	countsA, countsB := &counts{}, &counts{}
	dirA := tempDir(t)
	a := f.startAgent(agentSpec{id: "n1", world: wa, dataDir: dirA, token: f.invite("n1", 1, time.Minute).EnrollmentToken, counts: countsA})
	first := f.submit(schemas.RunRequest{RequestID: "before-takeover", Image: wa.image.Reference, Command: []string{"true"}})
	f.waitPhase(first, schemas.PhaseSucceeded, 60*time.Second)

	b := f.startAgent(agentSpec{id: "n1", world: wb, token: f.invite("n1", 1, time.Minute).EnrollmentToken, counts: countsB})
	if enr := b.agent.Enrollment(); enr.FencingToken != 2 || !enr.Duplicate {
		t.Fatalf("B's enrollment: token %d duplicate %v; want 2 and a resumed identity", enr.FencingToken, enr.Duplicate)
	}
	fencedBefore := f.plane.Metrics().FencedObservations

	// A forged report under A's old token must not move B's Run.
	second := f.submit(schemas.RunRequest{RequestID: "after-takeover", Image: wb.image.Reference, Command: []string{"sh", "-c", "sleep 2"}})
	r := f.waitPhase(second, schemas.PhaseRunning, 60*time.Second)
	code := 42
	forged := schemas.Observation{NodeID: "n1", FencingToken: 1, Generation: 1, Kind: schemas.ObsWorkload,
		Workload: &schemas.WorkloadObservation{RunID: second, AttemptID: r.AttemptID, Phase: schemas.WorkloadExited, ExitCode: &code, ObservedAt: time.Now()}}
	body, _ := codec.Encode(codec.MsgPack, forged)
	if _, err := f.conn.JS.Publish(context.Background(), bus.NodeObs("n1"), body); err != nil {
		t.Fatal(err)
	}
	done := f.waitPhase(second, schemas.PhaseSucceeded, 60*time.Second)
	if *done.ExitCode != 0 {
		t.Fatalf("forged exit code applied: %d", *done.ExitCode)
	}
	if countsA.launched(r.AttemptID) != 0 || countsB.launched(r.AttemptID) != 1 {
		t.Fatalf("launches of %s: A %d, B %d; want only B", r.AttemptID, countsA.launched(r.AttemptID), countsB.launched(r.AttemptID))
	}
	// On a slow machine the Run may have exited before the forged report was
	// published; then its handling follows the Run's end.
	f.eventually(30*time.Second, "the forged report counted as fenced", func() bool {
		return f.plane.Metrics().FencedObservations > fencedBefore
	})

	// A learns at its next renewal that it is superseded and stops itself.
	if err := a.part.wait(t, 20*time.Second); !errors.Is(err, agent.ErrSuperseded) {
		t.Fatalf("A stopped with %v, want ErrSuperseded", err)
	}
	// A restarted from its own data dir cannot enroll: its session is gone.
	before := f.nodeRecord("n1")
	a2 := f.startAgent(agentSpec{id: "n1", world: wa, dataDir: dirA, counts: countsA, noWait: true})
	var ref *schemas.Refusal
	if err := a2.part.wait(t, 20*time.Second); !errors.As(err, &ref) {
		t.Fatalf("restarted A: %v, want an enrollment refusal", err)
	}
	if after := f.nodeRecord("n1"); after.FencingToken != 2 || after.SessionTokenHash != before.SessionTokenHash {
		t.Fatalf("restarted A changed n1's session: token %d", after.FencingToken)
	}
	// B still works.
	third := f.submit(schemas.RunRequest{RequestID: "b-still-works", Image: wb.image.Reference, Command: []string{"true"}})
	f.waitPhase(third, schemas.PhaseSucceeded, 60*time.Second)
}
