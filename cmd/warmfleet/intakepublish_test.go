package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/schemas"
)

// TestRunSubmitAndCancelInATenant: `run submit` and `run cancel` publish on
// the subjects of --tenant and the CLI's identity, into that tenant's
// intake stream, the submit under its request id; the Run id printed is
// the tenant's. A tenant the control plane does not serve is refused
// tenant_unknown saying what to do, a malformed one before anything is
// sent.
func TestRunSubmitAndCancelInATenant(t *testing.T) {
	t.Setenv(bus.EnvNATSInboxName, "")
	b := newLogBus(t)
	ctx := context.Background()
	if err := bus.Provision(ctx, b.js, bus.Topology{Tenants: []string{"team-a", schemas.DefaultTenant}}); err != nil {
		t.Fatal(err)
	}
	var out, errs syncBuffer
	if err := cliOut(b.url, &out, &errs, "--tenant", "team-a", "run", "submit", "--image", testImage, "--request-id", "r1", "--", "true"); err != nil {
		t.Fatalf("submit: %v\n%s", err, errs.String())
	}
	runID := schemas.RunIDFor("team-a", "r1")
	if want := "submitted r1 as run " + runID; !strings.Contains(out.String(), want) {
		t.Fatalf("submit printed %q, want %q", out.String(), want)
	}
	var out2, errs2 syncBuffer
	if err := cliOut(b.url, &out2, &errs2, "--tenant", "team-a", "run", "cancel", runID); err != nil {
		t.Fatalf("cancel: %v\n%s", err, errs2.String())
	}
	s, err := b.js.Stream(ctx, bus.RunsStream("team-a"))
	if err != nil {
		t.Fatal(err)
	}
	sub, err := s.GetMsg(ctx, 1)
	if err != nil || sub.Subject != bus.SubmitSubject("team-a", bus.OperatorUser) || sub.Header.Get(jetstream.MsgIDHeader) != "r1" {
		t.Fatalf("stored submit: %+v, %v", sub, err)
	}
	cancel, err := s.GetMsg(ctx, 2)
	if err != nil || cancel.Subject != bus.CancelSubject("team-a", bus.OperatorUser) || !strings.Contains(string(cancel.Data), runID) {
		t.Fatalf("stored cancel: %+v, %v", cancel, err)
	}
	if info, err := b.js.Stream(ctx, bus.RunsStream(schemas.DefaultTenant)); err != nil || info.CachedInfo().State.Msgs != 0 {
		t.Fatalf("the default tenant's stream got a message: %v", err)
	}

	start := time.Now()
	err = cliOut(b.url, &syncBuffer{}, &syncBuffer{}, "--tenant", "nope", "run", "submit", "--image", testImage, "--", "true")
	var ref *schemas.Refusal
	if !errors.As(err, &ref) || ref.Code != schemas.CodeTenantUnknown || ref.Field != "--tenant" || !strings.Contains(err.Error(), "--producer-tokens-file") {
		t.Fatalf("submit to an unserved tenant: %v, want tenant_unknown on --tenant saying how to add it", err)
	}
	if d := time.Since(start); d > 8*time.Second {
		t.Errorf("the refusal took %s: it should not wait out the ack timeout", d)
	}
	err = cliOut(b.url, &syncBuffer{}, &syncBuffer{}, "--tenant", "Team.A", "run", "cancel", runID)
	if !errors.As(err, &ref) || ref.Code != schemas.CodeInvalidTenant {
		t.Fatalf("a malformed tenant: %v, want invalid_tenant", err)
	}
}

// TestIntakeErrorSaysWhatToDo: a permissions violation on the intake
// subject says to set --tenant to the login's tenant.
func TestIntakeErrorSaysWhatToDo(t *testing.T) {
	g := &globals{tenant: "team-b"}
	subj := bus.SubmitSubject("team-b", "acme")
	err := intakeError(g, subj, fmt.Errorf("%w: Permissions Violation for Publish to %q", nats.ErrPermissionViolation, subj))
	for _, want := range []string{"--tenant", envTenant, `"team-b"`, subj} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%v: lacks %q", err, want)
		}
	}
	if !errors.Is(err, nats.ErrPermissionViolation) {
		t.Errorf("%v does not wrap the violation", err)
	}
}

// TestRunListShowsTenant: an operator's `run list` has a TENANT column.
func TestRunListShowsTenant(t *testing.T) {
	b := newLogBus(t)
	for _, r := range []schemas.Run{{ID: "r-a", Tenant: "team-a", Phase: schemas.PhaseAccepted}, {ID: "r-old", Phase: schemas.PhaseAccepted}} {
		if _, err := bus.CreateJSON(context.Background(), b.kv, r.ID, &r); err != nil {
			t.Fatal(err)
		}
	}
	var out, errs syncBuffer
	if err := cliOut(b.url, &out, &errs, "run", "list"); err != nil {
		t.Fatalf("run list: %v\n%s", err, errs.String())
	}
	lines := strings.Split(out.String(), "\n")
	if !strings.HasPrefix(strings.Join(strings.Fields(lines[0]), " "), "RUN TENANT REQUEST") {
		t.Fatalf("header %q", lines[0])
	}
	for id, tenant := range map[string]string{"r-a": "team-a", "r-old": schemas.DefaultTenant} {
		found := false
		for _, l := range lines {
			if f := strings.Fields(l); len(f) > 1 && f[0] == id {
				found = f[1] == tenant
			}
		}
		if !found {
			t.Errorf("run %s not listed with tenant %s:\n%s", id, tenant, out.String())
		}
	}
}
