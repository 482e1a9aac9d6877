package agent

import (
	"testing"

	"github.com/warmfleet/warmfleet/schemas"
)

// TestLoadSession_Generations: a session saved under the configured
// generation or a later one (a resumed rental re-enrolled under the next) is
// resumed with the generation it was granted under; one from an earlier
// generation, or another node, is ignored in favour of the bootstrap.
func TestLoadSession_Generations(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{NodeID: "n1", Generation: 2, DataDir: dir}
	if _, _, ok := loadSession(cfg); ok {
		t.Fatal("a session loaded from an empty data dir")
	}
	for _, c := range []struct {
		node string
		gen  uint64
		ok   bool
	}{{"n1", 2, true}, {"n1", 5, true}, {"n1", 1, false}, {"n2", 2, false}} {
		if err := saveSession(dir, schemas.Enrollment{NodeID: c.node, Generation: c.gen, SessionToken: "tok", FencingToken: 3}); err != nil {
			t.Fatal(err)
		}
		tok, gen, ok := loadSession(cfg)
		if ok != c.ok || (ok && (tok != "tok" || gen != c.gen)) {
			t.Errorf("saved %s gen %d: got %q gen %d ok %v", c.node, c.gen, tok, gen, ok)
		}
	}
}
