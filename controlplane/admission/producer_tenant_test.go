package admission

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap/zaptest"

	"github.com/warmfleet/warmfleet/bus"
)

// TestCallout_ProducerConfinedToItsTenant: through the live callout, a
// producer of tenant a submits into a's intake stream under its own name
// and gets JetStream's ack with no JetStream API right; it may not publish
// as tenant b or as another producer, follow b's events or output, or
// reach any stream or bucket through the JetStream API.
func TestCallout_ProducerConfinedToItsTenant(t *testing.T) {
	alice, bob := newToken(), newToken()
	sb := startSecuredBusWith(t, Config{Producers: map[string]Producer{"alice": {Token: alice, Tenant: "a"}, "bob": {Token: bob, Tenant: "b"}}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := bus.Provision(ctx, sb.cp.JS, bus.Topology{Tenants: []string{"a", "b"}}); err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 64)
	opts := append(bus.ProducerCredentials("alice", alice).Options(), nats.RetryOnFailedConnect(false),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case errs <- err:
			default:
			}
		}))
	c, err := bus.Connect(sb.url, "alice", zaptest.NewLogger(t), opts...)
	if err != nil {
		t.Fatalf("alice logs in: %v", err)
	}
	t.Cleanup(c.Close)

	ack, err := c.JS.Publish(ctx, bus.SubmitSubject("a", "alice"), []byte(`{}`), jetstream.WithMsgID("m-1"))
	if err != nil || ack.Stream != bus.RunsStream("a") {
		t.Fatalf("alice's submit in tenant a: %+v, %v", ack, err)
	}
	if _, err := c.NC.SubscribeSync(bus.RunEventsSubject("a", ">")); err != nil {
		t.Fatal(err)
	}
	for _, subj := range []string{
		bus.SubmitSubject("b", "alice"), bus.CancelSubject("b", "alice"), bus.SubmitSubject("a", "bob"),
		bus.TenantSubject("b", bus.TenantRunsGet), bus.SessionInbox("b", "s1"),
		"$JS.API.INFO", "$JS.API.STREAM.INFO." + bus.StreamEvents, "$JS.API.DIRECT.GET." + bus.StreamEvents + "." + bus.RunEventsSubject("b", "r1"),
		"$JS.API.DIRECT.GET.KV_" + bus.BucketRuns, "$JS.API.STREAM.MSG.GET." + bus.StreamLogs, "$KV." + bus.BucketRuns + ".r1",
		"$JS.API.CONSUMER.CREATE." + bus.StreamEvents,
	} {
		if err := c.NC.Publish(subj, []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
		wantViolation(t, errs, subj)
	}
	for _, subj := range []string{bus.RunEventsSubject("b", ">"), bus.RunLogsSubject("b", "r1"), bus.SubjectEvents, bus.SubjectLogsAll} {
		if _, err := c.NC.SubscribeSync(subj); err != nil {
			t.Fatal(err)
		}
		wantViolation(t, errs, subj)
	}
	// Nothing of tenant a's went to b's stream.
	s, err := sb.cp.JS.Stream(ctx, bus.RunsStream("b"))
	if err != nil {
		t.Fatal(err)
	}
	if info, err := s.Info(ctx); err != nil || info.State.Msgs != 0 {
		t.Fatalf("tenant b's intake stream holds %+v (%v)", info.State, err)
	}
}
