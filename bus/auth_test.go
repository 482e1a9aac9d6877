package bus_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/warmfleet/warmfleet/bus"
)

func TestNodeLogUser(t *testing.T) {
	node, run, ok := bus.ParseNodeLogUser(bus.NodeLogUser("gpu-7", "r-0a1b"))
	if !ok || node != "gpu-7" || run != "r-0a1b" {
		t.Fatalf("round trip: %q %q %v", node, run, ok)
	}
	for _, bad := range []string{"gpu-7", "/r1", "gpu-7/", "a/b/c", "a.b/r1", "a/r1.x", "a/*", ">/r1", "a/r 1"} {
		if n, r, ok := bus.ParseNodeLogUser(bad); ok {
			t.Errorf("%q parsed as %q, %q", bad, n, r)
		}
		if !strings.Contains(bad, "/") == bus.IsNodeLogUser(bad) {
			t.Errorf("IsNodeLogUser(%q) = %v", bad, bus.IsNodeLogUser(bad))
		}
	}
}

// FuzzParseNodeLogUser: whatever parses is two subject tokens that make
// the same user again, so it can become part of a permission subject.
func FuzzParseNodeLogUser(f *testing.F) {
	f.Add("n1/r1")
	f.Add("n1/r1.>")
	f.Fuzz(func(t *testing.T, user string) {
		node, run, ok := bus.ParseNodeLogUser(user)
		if !ok {
			return
		}
		if !bus.SubjectToken(node) || !bus.SubjectToken(run) || strings.Contains(node+run, "/") || bus.NodeLogUser(node, run) != user {
			t.Fatalf("%q parsed as %q, %q", user, node, run)
		}
	})
}

func TestPermsNodeLogs(t *testing.T) {
	p := bus.PermsNodeLogs("n1", "acme", "r1")
	if len(p.Publish) != 1 || p.Publish[0] != "wf.logs.acme.run.r1" || p.Responses {
		t.Fatalf("publish %v, responses %v", p.Publish, p.Responses)
	}
	inbox := bus.NodeLogInboxPrefix("n1", "r1")
	if len(p.Subscribe) != 1 || p.Subscribe[0] != inbox+".>" || !strings.HasPrefix(inbox, bus.NodeInboxPrefix("n1")+".") {
		t.Fatalf("subscribe %v", p.Subscribe)
	}
}

// TestPermsProducerStaysInItsTenant: every subject a producer of tenant a
// may publish or subscribe names tenant a (or its own inbox), none reaches
// tenant b or any other producer's name, and none is JetStream or KV API.
func TestPermsProducerStaysInItsTenant(t *testing.T) {
	p := bus.PermsProducer("acme", "a")
	want := bus.Permissions{
		Publish:   []string{"wf.runs.a.acme.submit", "wf.runs.a.acme.cancel", "wf.tenant.a.>", "wf.residency.a.*.inbox"},
		Subscribe: []string{"wf.events.a.>", "wf.logs.a.>", "_WF_INBOX.producer.acme.>"},
	}
	if !slices.Equal(p.Publish, want.Publish) || !slices.Equal(p.Subscribe, want.Subscribe) || p.Responses {
		t.Fatalf("PermsProducer(acme, a) = %+v, want %+v", p, want)
	}
	for _, s := range append(slices.Clone(p.Publish), p.Subscribe...) {
		toks := strings.Split(s, ".")
		if strings.HasPrefix(s, "$") || strings.Contains(s, "KV") || s == ">" {
			t.Errorf("producer may use %q", s)
		}
		if slices.Contains(toks, "b") || (toks[0] == "wf" && (len(toks) < 3 || toks[2] != "a")) {
			t.Errorf("producer of tenant a may use %q, which is not tenant a's", s)
		}
	}
	other := bus.PermsProducer("beta", "b")
	for _, s := range append(slices.Clone(other.Publish), other.Subscribe...) {
		if slices.Contains(p.Publish, s) || slices.Contains(p.Subscribe, s) {
			t.Errorf("producers of tenants a and b share %q", s)
		}
	}
}

// TestIntakeSubject: the intake subjects carry tenant and identity back out;
// any other form is refused.
func TestIntakeSubject(t *testing.T) {
	if tn, id, verb, ok := bus.ParseIntakeSubject(bus.SubmitSubject("a", "acme")); !ok || tn != "a" || id != "acme" || verb != "submit" {
		t.Fatalf("submit subject parsed as %q %q %q %v", tn, id, verb, ok)
	}
	if tn, id, verb, ok := bus.ParseIntakeSubject(bus.CancelSubject("a", "operator")); !ok || tn != "a" || id != "operator" || verb != "cancel" {
		t.Fatalf("cancel subject parsed as %q %q %q %v", tn, id, verb, ok)
	}
	for _, bad := range []string{"wf.runs.submit", "wf.runs.a.submit", "wf.runs.a.b.c.submit", "wf.runs.a.b.list", "wf.events.a.b.submit", "wf.runs..b.submit", "wf.runs.a.*.submit", "wf.runs.>.b.cancel"} {
		if _, _, _, ok := bus.ParseIntakeSubject(bad); ok {
			t.Errorf("%q parsed", bad)
		}
	}
}

// TestArtifactUser: an artifact login's user names its node and no other
// identity's name has its form.
func TestArtifactUser(t *testing.T) {
	if id, ok := bus.ParseArtifactUser(bus.ArtifactUser("gpu-7")); !ok || id != "gpu-7" {
		t.Fatalf("ParseArtifactUser(ArtifactUser(gpu-7)) = %q, %v", id, ok)
	}
	for _, u := range []string{"gpu-7", "@artifact", "a.b@artifact", "a@b@artifact", "n/r@artifact", "gpu-7@artifacts"} {
		if _, ok := bus.ParseArtifactUser(u); ok {
			t.Errorf("ParseArtifactUser(%q) accepted", u)
		}
	}
	if bus.IsArtifactUser("gpu-7") || bus.IsArtifactUser(bus.NodeLogUser("gpu-7", "run-1")) || !bus.IsArtifactUser(bus.ArtifactUser("gpu-7")) {
		t.Fatal("IsArtifactUser mistakes a node or log login")
	}
}

// TestPermsArtifactReader: only pulls and info of the one consumer it was
// granted; no consumer create or delete, no direct or message get, nothing
// under $O (a write), no wf.* subject.
func TestPermsArtifactReader(t *testing.T) {
	consumer := bus.ArtifactConsumer("gpu-7", "abc")
	p := bus.PermsArtifactReader("gpu-7", consumer)
	api := "OBJ_" + bus.ObjectBucketArtifacts + "." + consumer
	want := []string{"$JS.API.CONSUMER.INFO." + api, "$JS.API.CONSUMER.MSG.NEXT." + api}
	if !slices.Equal(p.Publish, want) {
		t.Errorf("publish %v, want %v", p.Publish, want)
	}
	for _, s := range p.Publish {
		if strings.ContainsAny(s, "*>") {
			t.Errorf("publish %q holds a wildcard", s)
		}
	}
	if len(p.Subscribe) != 1 || p.Subscribe[0] != bus.ArtifactInboxPrefix("gpu-7")+".>" || p.Responses {
		t.Errorf("subscribe %v (responses %v), want its own inbox only", p.Subscribe, p.Responses)
	}
}

// FuzzParseIntakeSubject: whatever parses names one tenant token and one
// identity token, and is the very subject SubmitSubject or CancelSubject
// makes of them, so intake records exactly the tenant and identity the
// auth callout let publish there.
func FuzzParseIntakeSubject(f *testing.F) {
	f.Add("wf.runs.default.operator.submit")
	f.Add("wf.runs.a.b.c.cancel")
	f.Fuzz(func(t *testing.T, subject string) {
		tenant, identity, verb, ok := bus.ParseIntakeSubject(subject)
		if !ok {
			return
		}
		if !bus.SubjectToken(tenant) || !bus.SubjectToken(identity) {
			t.Fatalf("%q parsed as %q, %q", subject, tenant, identity)
		}
		remade := bus.SubmitSubject(tenant, identity)
		if verb == "cancel" {
			remade = bus.CancelSubject(tenant, identity)
		}
		if remade != subject {
			t.Fatalf("%q parsed as %q %q %q, which make %q", subject, tenant, identity, verb, remade)
		}
	})
}
