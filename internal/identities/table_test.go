package identities

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/warmfleet/warmfleet/bus"
)

func securityPage(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "security.md"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func pageRows(t *testing.T) []Row {
	t.Helper()
	rows, err := ParseTable(securityPage(t))
	if err != nil {
		t.Fatal(err)
	}
	return rows
}

func row(t *testing.T, rows []Row, identity string) Row {
	t.Helper()
	for _, r := range rows {
		if r.Identity == identity {
			return r
		}
	}
	t.Fatalf("no row %q in the identity table", identity)
	return Row{}
}

// TestTableMatchesCode: every row of docs/security.md's identity table
// lists exactly what bus's Perms* functions grant that identity, publish
// and subscribe, both ways, and its right to answer; its streams cell names
// exactly the streams and buckets those publish patterns reach.
func TestTableMatchesCode(t *testing.T) {
	rows := pageRows(t)
	for _, want := range []string{"control plane", "operator", "CLI", "CLI as a producer", "producer", "enrolling node", "node", "log login", "artifact login"} {
		row(t, rows, want)
	}
	for _, r := range rows {
		p, full, err := Granted(r.Identity)
		if err != nil {
			t.Error(err)
			continue
		}
		for _, d := range Diff(r, p, full) {
			t.Error(d)
		}
		if got := Reaches(r.Publish); !slices.Equal(got, r.Reaches) {
			t.Errorf("%s (line %d): the streams cell names %q; its publish patterns reach %q", r.Identity, r.Line, r.Reaches, got)
		}
	}
}

// TestDiffCatchesAnUnlistedPermission: a right added to a Perms* function
// and not to the table fails, as does a row listing a right the code took
// away, or a right to answer the table does not give.
func TestDiffCatchesAnUnlistedPermission(t *testing.T) {
	node := row(t, pageRows(t), "node")
	granted := bus.PermsNode(PlaceholderNode)
	if d := Diff(node, granted, false); len(d) != 0 {
		t.Fatalf("the node row and PermsNode differ before the change: %q", d)
	}
	wider := granted
	wider.Publish = append(slices.Clone(granted.Publish), "$KV."+bus.BucketNodes+"."+PlaceholderNode)
	if d := Diff(node, wider, false); len(d) != 1 || !strings.Contains(d[0], "the code grants publish `$KV.wf_nodes.<id>`") {
		t.Errorf("a publish right in code only: %q", d)
	}
	wider = granted
	wider.Subscribe = append(slices.Clone(granted.Subscribe), bus.SubjectNodeCmdAll)
	if d := Diff(node, wider, false); len(d) != 1 || !strings.Contains(d[0], "subscribe `wf.node.*.cmd`") {
		t.Errorf("a subscribe right in code only: %q", d)
	}
	narrower := granted
	narrower.Publish = slices.DeleteFunc(slices.Clone(granted.Publish), func(s string) bool { return s == bus.NodeObs(PlaceholderNode) })
	if d := Diff(node, narrower, false); len(d) != 1 || !strings.Contains(d[0], "the table lists publish `wf.node.<id>.obs`, which the code does not grant") {
		t.Errorf("a publish right in the table only: %q", d)
	}
	if d := Diff(node, granted, true); len(d) != 1 || !strings.Contains(d[0], "may answer") {
		t.Errorf("full permissions in code, one answer in the table: %q", d)
	}
	enrolling := row(t, pageRows(t), "enrolling node")
	answering, _, _ := Granted("enrolling node")
	answering.Responses = true
	if d := Diff(enrolling, answering, false); len(d) != 1 {
		t.Errorf("allow_responses in code only: %q", d)
	}
}

// TestReaches: a publish pattern reaches a store by its subjects or an
// API subject naming its stream.
func TestReaches(t *testing.T) {
	for _, c := range []struct {
		publish []string
		want    []string
	}{
		{[]string{"wf.node.a.obs", "wf.node.a.heartbeat"}, []string{bus.StreamObs}},
		{[]string{"$JS.API.DIRECT.GET.KV_wf_runs.>"}, []string{bus.BucketRuns}},
		{[]string{"$JS.FC." + bus.ObjectStream(bus.ObjectBucketArtifacts) + ".>"}, []string{bus.ObjectBucketArtifacts}},
		{[]string{"$JS.API.STREAM.INFO.*"}, []string{AllStreams}},
		{[]string{">"}, []string{AllStreams}},
		{[]string{"wf.enroll", "$JS.API.INFO"}, nil},
		{[]string{"$KV.wf_leases.x"}, []string{bus.BucketLeases}},
	} {
		if got := Reaches(c.publish); !slices.Equal(got, c.want) {
			t.Errorf("Reaches(%q) = %q, want %q", c.publish, got, c.want)
		}
	}
}

func TestCoversAndCollide(t *testing.T) {
	for _, c := range []struct {
		pattern, subject string
		covers, collide  bool
	}{
		{"wf.node.a.obs", "wf.node.a.obs", true, true},
		{"wf.node.*.obs", "wf.node.a.obs", true, true},
		{"wf.node.a.obs", "wf.node.*.obs", false, true},
		{"wf.node.a.sessions.*", "wf.node.a.sessions.>", false, true},
		{"_WF_INBOX.node.a.>", "_WF_INBOX.node.a", false, false},
		{"_WF_INBOX.node.a.>", "_WF_INBOX.node.a.x.>", true, true},
		{">", "$JS.API.INFO", true, true},
		{"wf.node.a.obs", "wf.node.b.obs", false, false},
		{"a.*", "a.b.c", false, false},
	} {
		if got := Covers(c.pattern, c.subject); got != c.covers {
			t.Errorf("Covers(%q, %q) = %v", c.pattern, c.subject, got)
		}
		if got := Collide(c.pattern, c.subject); got != c.collide {
			t.Errorf("Collide(%q, %q) = %v", c.pattern, c.subject, got)
		}
	}
}

func TestParseTableRefuses(t *testing.T) {
	head := Heading + "\n\n| " + strings.Join(Columns, " | ") + " |\n| --- | --- | --- | --- | --- | --- |\n"
	ok := "| node | x | `wf.node.<id>.obs` | `_WF_INBOX.node.<id>.>` | no | `WF_OBS` |\n"
	if rows, err := ParseTable(head + ok); err != nil || len(rows) != 1 || rows[0].Publish[0] != "wf.node.<id>.obs" {
		t.Fatalf("a good table: %+v, %v", rows, err)
	}
	for name, bad := range map[string]string{
		"no table":             "# nothing\n",
		"five columns":         Heading + "\n\n| a | b | c | d | e |\n",
		"renamed column":       strings.Replace(head, "may answer", "replies", 1) + ok,
		"no publish pattern":   head + "| node | x | nothing | `a` | no | none |\n",
		"unknown placeholder":  head + "| node | x | `wf.node.<node>.obs` | `a` | no | none |\n",
		"bad pattern":          head + "| node | x | `wf.>.obs` | `a` | no | none |\n",
		"bad answer":           head + "| node | x | `a` | `a` | maybe | none |\n",
		"streams unnamed":      head + "| node | x | `a` | `a` | no | some |\n",
		"reference to nothing": head + "| cli | x | as the **operator** row | `a` | no | none |\n",
	} {
		if _, err := ParseTable(bad); err == nil {
			t.Errorf("%s: parsed", name)
		}
	}
	ref := head + ok + "| copy | x | as the **node** row | as the **node** row | as the **node** row | as the **node** row |\n"
	rows, err := ParseTable(ref)
	if err != nil || len(rows) != 2 || !slices.Equal(rows[0].Publish, rows[1].Publish) || !slices.Equal(rows[1].Reaches, []string{"WF_OBS"}) {
		t.Fatalf("a row repeating another: %+v, %v", rows, err)
	}
}

func TestInstantiate(t *testing.T) {
	got := Instantiate([]string{"wf.node.<id>.obs", "wf.logs.<tenant>.run.<run>", "$JS.API.X"}, map[string]string{PlaceholderNode: "a", PlaceholderRun: "r", PlaceholderTenant: "t"})
	if !slices.Equal(got, []string{"wf.node.a.obs", "wf.logs.t.run.r", "$JS.API.X"}) {
		t.Fatal(got)
	}
}
