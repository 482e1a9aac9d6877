package identities

import (
	"fmt"
	"slices"
	"strings"

	"github.com/warmfleet/warmfleet/bus"
)

// Full is what a login with full permissions may do: the control plane's
// own (a user of nats-server's configuration, no permissions set) and the
// operator's (the callout's grant carries none).
func Full() bus.Permissions { return bus.Permissions{Publish: []string{">"}, Subscribe: []string{">"}} }

// Granted is what the code grants the table's identity, with the
// placeholders for its values (bus's Perms* functions, called with
// `<id>`, `<run>`, `<name>`, `<tenant>`, `<consumer>`, `<invite>`), and whether it is Full. A row the code knows
// nothing of is an error: each identity the table lists must be one the
// callout can grant. When a Perms* function's parameters change, this is
// the one place that calls it.
func Granted(identity string) (p bus.Permissions, full bool, err error) {
	switch identity {
	case "control plane", "operator", "CLI":
		return Full(), true, nil
	case "producer", "CLI as a producer":
		return bus.PermsProducer(PlaceholderProducer, PlaceholderTenant), false, nil
	case "enrolling node":
		return bus.PermsEnrolling(PlaceholderNode, bus.EnrollInboxRoot(PlaceholderNode)+"."+PlaceholderInvite), false, nil
	case "node":
		return bus.PermsNode(PlaceholderNode), false, nil
	case "log login":
		return bus.PermsNodeLogs(PlaceholderNode, PlaceholderTenant, PlaceholderRun), false, nil
	case "artifact login":
		return bus.PermsArtifactReader(PlaceholderNode, PlaceholderConsumer), false, nil
	}
	return bus.Permissions{}, false, fmt.Errorf("identity %q: no grant in code; name it in identities.Granted", identity)
}

// Diff lists every difference between a row and what the code grants it:
// a pattern granted and not in the row, one in the row and not granted,
// and the right to answer. Empty when they agree.
func Diff(r Row, p bus.Permissions, full bool) []string {
	var out []string
	side := func(what string, table, code []string) {
		for _, s := range code {
			if !slices.Contains(table, s) {
				out = append(out, fmt.Sprintf("%s (line %d): the code grants %s `%s`, which the table does not list", r.Identity, r.Line, what, s))
			}
		}
		for _, s := range table {
			if !slices.Contains(code, s) {
				out = append(out, fmt.Sprintf("%s (line %d): the table lists %s `%s`, which the code does not grant", r.Identity, r.Line, what, s))
			}
		}
	}
	side("publish", r.Publish, p.Publish)
	side("subscribe", r.Subscribe, p.Subscribe)
	want := RepliesNone
	switch {
	case full:
		want = RepliesAny
	case p.Responses:
		want = RepliesOne
	}
	if r.Replies != want {
		out = append(out, fmt.Sprintf("%s (line %d): the table says it may answer %q, the code %q", r.Identity, r.Line, r.Replies, want))
	}
	return out
}

// A Store is one stream, KV bucket or object store bucket as the table
// names it, with the stream that holds it and the subjects it stores.
type Store struct {
	Name, Stream string
	Subjects     []string
}

// Stores lists every stream and bucket the control plane provisions
// (bus.Topology), by the name the table uses: a stream by its name, a KV
// or object store bucket by the bucket's. The intake stream is one
// tenant's, WF_RUNS_<tenant>.
func Stores() []Store {
	t := bus.Topology{Tenants: []string{PlaceholderTenant}}
	var out []Store
	for _, c := range t.StreamConfigs() {
		out = append(out, Store{Name: c.Name, Stream: c.Name, Subjects: c.Subjects})
	}
	for _, c := range t.KVConfigs() {
		out = append(out, Store{Name: c.Bucket, Stream: "KV_" + c.Bucket, Subjects: []string{"$KV." + c.Bucket + ".>"}})
	}
	for _, c := range t.ObjectStoreConfigs() {
		out = append(out, Store{Name: c.Bucket, Stream: bus.ObjectStream(c.Bucket), Subjects: []string{"$O." + c.Bucket + ".>"}})
	}
	return out
}

// Reaches names the stores a login allowed to publish on these patterns
// can write or read: by publishing on a stream's subjects, or through a
// JetStream API, ack or flow-control subject that names its stream.
// AllStreams when it reaches every one.
func Reaches(publish []string) []string {
	var names []string
	stores := Stores()
	for _, s := range stores {
		if slices.ContainsFunc(publish, func(p string) bool { return reaches(p, s) }) {
			names = append(names, s.Name)
		}
	}
	if len(names) == len(stores) {
		return []string{AllStreams}
	}
	slices.Sort(names)
	return names
}

func reaches(p string, s Store) bool {
	for _, subj := range s.Subjects {
		if Collide(p, subj) {
			return true
		}
	}
	if Collide(p, "$JS.API.STREAM.INFO."+s.Stream) {
		return true
	}
	return strings.HasPrefix(p, "$JS.") && slices.Contains(strings.Split(p, "."), s.Stream)
}
