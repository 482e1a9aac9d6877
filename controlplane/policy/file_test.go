package policy

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/warmfleet/warmfleet/schemas"
)

const (
	policyV1  = `{"priority_classes":[{"name":"urgent","value":1000,"preempts":true},{"name":"batch"}],"default_priority":"batch"}`
	policyV2  = `{"priority_classes":[{"name":"urgent","value":1000,"preempts":true}],"tenants":{"acme":{"quota":{"gpus":{"*":4}}}}}`
	policyV3  = `{"tenants":{"acme":{"budget":{"amount_usd":500,"period":"day"}}}}`
	policyBad = `{"tenants":{"acme":{"budget":{"amount_usd":-1,"period":"day"}}}}`
)

// clock is a test clock the File's stat interval runs on.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// replace writes data beside path and renames it over path: a new inode,
// as editors and config management write.
func replace(t *testing.T, path, data string) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func loadTest(t *testing.T, data string) (*File, *clock, *observer.ObservedLogs) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "policy.json")
	replace(t, path, data)
	core, logs := observer.New(zapcore.InfoLevel)
	f, err := Load(path, zap.New(core))
	if err != nil {
		t.Fatal(err)
	}
	c := &clock{t: time.Unix(1_800_000_000, 0)}
	f.now = c.now
	f.nextStat.Store(c.now().Add(StatInterval).UnixNano())
	return f, c, logs
}

func TestFileReloadsOnChange(t *testing.T) {
	f, c, logs := loadTest(t, policyV1)
	s1 := f.Current()
	if s1.Version != Version([]byte(policyV1)) || s1.DefaultPriority != "batch" || len(s1.PriorityClasses) != 2 {
		t.Fatalf("loaded %+v", s1)
	}
	replace(t, f.path, policyV2)
	if got := f.Current(); got != s1 {
		t.Fatalf("read again within %s of the last look", StatInterval)
	}
	c.add(StatInterval)
	s2 := f.Current()
	if s2.Version != Version([]byte(policyV2)) || s2.Tenant("acme").Quota.GPUs["*"] != 4 {
		t.Fatalf("after the change: %+v", s2)
	}
	if logs.FilterMessage("scheduling policy read again").Len() != 1 {
		t.Fatalf("logs: %v", logs.All())
	}
	// The same bytes written again: the same Snapshot.
	replace(t, f.path, policyV2)
	c.add(StatInterval)
	if f.Current() != s2 || f.ReloadFailures() != 0 {
		t.Fatal("an unchanged policy was taken as a new one")
	}
}

func TestFileBadNewFileKeepsOld(t *testing.T) {
	f, c, logs := loadTest(t, policyV1)
	s1 := f.Current()
	replace(t, f.path, policyBad)
	c.add(StatInterval)
	if f.Current() != s1 || f.ReloadFailures() != 1 {
		t.Fatalf("a bad file replaced the policy, or was not counted (%d)", f.ReloadFailures())
	}
	warns := logs.FilterLevelExact(zapcore.WarnLevel).All()
	if len(warns) != 1 {
		t.Fatalf("warnings: %v", warns)
	}
	ctx := warns[0].ContextMap()
	if ctx["field"] != "tenants.acme.budget.amount_usd" || ctx["code"] != string(schemas.CodeInvalidPolicy) || ctx["reason"] == "" {
		t.Fatalf("warning does not say why: %v", ctx)
	}
	// Unchanged since: not read, not counted again.
	c.add(StatInterval)
	if f.Current() != s1 || f.ReloadFailures() != 1 {
		t.Fatalf("the bad file was counted again: %d", f.ReloadFailures())
	}
	replace(t, f.path, policyV3)
	c.add(StatInterval)
	if got := f.Current(); got.Version != Version([]byte(policyV3)) {
		t.Fatalf("a good file after a bad one was not read: %+v", got)
	}
}

func TestFileVanishedKeepsOld(t *testing.T) {
	f, c, logs := loadTest(t, policyV1)
	s1 := f.Current()
	if err := os.Remove(f.path); err != nil {
		t.Fatal(err)
	}
	c.add(StatInterval)
	if f.Current() != s1 || f.ReloadFailures() != 1 {
		t.Fatalf("a vanished file dropped the policy, or was not counted (%d)", f.ReloadFailures())
	}
	c.add(StatInterval)
	if f.Current() != s1 || f.ReloadFailures() != 1 || logs.FilterLevelExact(zapcore.WarnLevel).Len() != 1 {
		t.Fatalf("a file still gone was counted or logged again: %d", f.ReloadFailures())
	}
	replace(t, f.path, policyV2)
	c.add(StatInterval)
	if got := f.Current(); got.Version != Version([]byte(policyV2)) {
		t.Fatalf("the file back was not read: %+v", got)
	}
}

func TestLoadRefusesBadFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct {
		name, path, want string
		field            string
	}{
		{"invalid", write("bad.json", policyBad), "negative", "tenants.acme.budget.amount_usd"},
		{"unknown field", write("unknown.json", `{"tenant":{}}`), "not a field", "tenant"},
		{"bad spot", write("spot.json", `{"tenants":{"acme":{"spot":"maybe"}}}`), "never, allowed or only", "tenants.acme.spot"},
		{"too large", write("large.json", "{}"+strings.Repeat(" ", schemas.MaxPolicyBytes)), "limit", ""},
		{"missing", filepath.Join(dir, "none.json"), "no such file", ""},
		{"directory", dir, "not a regular file", ""},
	} {
		_, err := Load(tc.path, zap.NewNop())
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want a refusal saying %q", tc.name, err, tc.want)
			continue
		}
		var r *schemas.Refusal
		if tc.field != "" && (!errors.As(err, &r) || r.Code != schemas.CodeInvalidPolicy || r.Field != tc.field) {
			t.Errorf("%s: %v, want invalid_policy naming %s", tc.name, err, tc.field)
		}
	}
}

// A path that turns into something unreadable as a policy (here a
// directory) keeps the policy and is counted once, not at every look.
func TestFileUnreadableCountedOnce(t *testing.T) {
	f, c, _ := loadTest(t, policyV1)
	s1 := f.Current()
	if err := os.Remove(f.path); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(f.path, 0o755); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		c.add(StatInterval)
		if f.Current() != s1 {
			t.Fatal("a directory replaced the policy")
		}
	}
	if got := f.ReloadFailures(); got != 1 {
		t.Fatalf("reload failures = %d, want 1", got)
	}
}
