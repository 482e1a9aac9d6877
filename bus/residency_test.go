package bus

import "testing"

// The node id in a residency request's subject is the caller: it is read
// back from exactly the subjects NodeResidencyService builds.
func TestResidencyServiceNode(t *testing.T) {
	for subject, want := range map[string]string{
		NodeResidencyService("n-1", "lease_renew"): "n-1",
		NodeResidencyService("n1", "state_load"):   "n1",
		"wf.node.n1.sessions.attach":               "",
		"wf.node..residency.lease_renew":           "",
		"wf.node.n1.residency.":                    "",
		"wf.node.a.b.residency.lease_renew":        "",
		"wf.node.n1.residency.lease.renew":         "",
		"wf.nodes.n1.residency.lease_renew":        "",
		"wf.node.n1.heartbeat":                     "",
	} {
		if got := ResidencyServiceNode(subject); got != want {
			t.Errorf("ResidencyServiceNode(%q) = %q, want %q", subject, got, want)
		}
	}
}
