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
	p := bus.PermsNodeLogs("n1", "r1")
	if len(p.Publish) != 1 || p.Publish[0] != "wf.logs.run.r1" || p.Responses {
		t.Fatalf("publish %v, responses %v", p.Publish, p.Responses)
	}
	inbox := bus.NodeLogInboxPrefix("n1", "r1")
	if len(p.Subscribe) != 1 || p.Subscribe[0] != inbox+".>" || !strings.HasPrefix(inbox, bus.NodeInboxPrefix("n1")+".") {
		t.Fatalf("subscribe %v", p.Subscribe)
	}
}

// TestPermsProducerReadsNoLogs: producers read no output today
// (docs/security.md).
func TestPermsProducerReadsNoLogs(t *testing.T) {
	p := bus.PermsProducer("acme")
	for _, s := range append(p.Publish, p.Subscribe...) {
		if strings.Contains(s, bus.StreamLogs) || strings.HasPrefix(s, "wf.logs.") || s == ">" {
			t.Errorf("producer may use %q", s)
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
