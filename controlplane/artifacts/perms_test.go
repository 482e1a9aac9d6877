package artifacts_test

import (
	"strings"
	"testing"

	"github.com/warmfleet/warmfleet/bus"
)

// matches reports whether NATS subject pattern p (with * and >) covers s.
func matches(p, s string) bool {
	pt, st := strings.Split(p, "."), strings.Split(s, ".")
	for i, t := range pt {
		if t == ">" {
			return i < len(st)
		}
		if i >= len(st) || (t != "*" && t != st[i]) {
			return false
		}
	}
	return len(pt) == len(st)
}

// TestOnlyOperatorsChangeTheCatalog: no producer, node or enrolling
// login may publish a catalog change or write the catalog's buckets
// directly; operators hold full permissions.
func TestOnlyOperatorsChangeTheCatalog(t *testing.T) {
	if !matches("wf.admin.>", bus.SubjectArtifactRegister) || matches("wf.admin.*", bus.SubjectArtifactRegister) {
		t.Fatal("the subject matcher is wrong")
	}
	for who, perms := range map[string]bus.Permissions{
		"producer":  bus.PermsProducer("team-a", "default"),
		"node":      bus.PermsNode("node-1"),
		"enrolling": bus.PermsEnrolling("node-1"),
		"node logs": bus.PermsNodeLogs("node-1", "default", "run-1"),
	} {
		for _, p := range perms.Publish {
			for _, s := range []string{bus.SubjectArtifactRegister, bus.SubjectArtifactRemove,
				"$KV." + bus.BucketArtifacts + ".llama/v1", "$O." + bus.ObjectBucketArtifacts + ".M.x", "$O." + bus.ObjectBucketArtifacts + ".C.x"} {
				if matches(p, s) {
					t.Errorf("a %s may publish %s (by %s)", who, s, p)
				}
			}
		}
	}
}
