package bus_test

import (
	"reflect"
	"strings"
	"testing"

	"github.com/warmfleet/warmfleet/bus"
)

// producerPerms is what a producer of tenant acme may do. PermsProducer is
// called by reflection with a string per parameter, so the check holds
// whether it takes the producer's name alone or its tenant too.
func producerPerms(t *testing.T) bus.Permissions {
	t.Helper()
	f := reflect.ValueOf(bus.PermsProducer)
	args := make([]reflect.Value, f.Type().NumIn())
	for i := range args {
		args[i] = reflect.ValueOf("acme")
	}
	return f.Call(args)[0].Interface().(bus.Permissions)
}

// reaches says whether a permission pattern matches any subject under
// prefix (a subject with more tokens than prefix, starting with them),
// minding NATS's wildcards.
func reaches(pattern, prefix string) bool {
	pt, want := strings.Split(pattern, "."), strings.Split(prefix, ".")
	for i, w := range want {
		switch {
		case i >= len(pt):
			return false
		case pt[i] == ">":
			return true
		case pt[i] != "*" && pt[i] != w:
			return false
		}
	}
	return len(pt) > len(want)
}

func TestReaches(t *testing.T) {
	for pattern, want := range map[string]bool{
		">": true, "wf.>": true, "*.admin.x": true, "wf.*.>": true, "wf.admin.node.drain": true,
		"wf.admin": false, "wf.runs.acme.*.submit": false, "wf.tenant.acme.>": false, "_WF_INBOX.producer.acme.>": false, "*": false,
	} {
		if got := reaches(pattern, "wf.admin"); got != want {
			t.Errorf("reaches(%q, wf.admin) = %v, want %v", pattern, got, want)
		}
	}
}

// TestPermsProducerNoAdminNoNode: a producer may neither publish nor
// subscribe to anything under wf.admin. (node prune, drain and invite,
// rentals, prefetches, the catalog, sessions, the secrets key) or wf.node.
// (a node's commands and credential services), and it may not answer
// requests; the operators' subjects are all under wf.admin.
func TestPermsProducerNoAdminNoNode(t *testing.T) {
	p := producerPerms(t)
	if p.Responses {
		t.Error("a producer may answer requests")
	}
	for kind, subjects := range map[string][]string{"publish": p.Publish, "subscribe": p.Subscribe} {
		for _, s := range subjects {
			for _, prefix := range []string{"wf.admin", "wf.node"} {
				if reaches(s, prefix) {
					t.Errorf("a producer may %s %q, which reaches %s.>", kind, s, prefix)
				}
			}
		}
	}
	for _, s := range []string{bus.SubjectPrune, bus.SubjectDrain, bus.SubjectInvite, bus.SubjectNodeLeases, bus.SubjectRetire, bus.SubjectPrefetch,
		bus.SubjectArtifactRegister, bus.SubjectArtifactRemove, bus.SubjectSessionAttach, bus.SubjectSessionRelease, bus.SubjectSecretRotateKey} {
		if !strings.HasPrefix(s, "wf.admin.") {
			t.Errorf("operators' subject %s is not under wf.admin.", s)
		}
	}
}
