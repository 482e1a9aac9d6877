package archcheck_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warmfleet/warmfleet/internal/archcheck"
)

const module = "github.com/warmfleet/warmfleet"

// repoRoot is the module's root, two folders up from this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("no go.mod at %s: %v", root, err)
	}
	return root
}

// TestImportRules holds the code to docs/architecture.md's package table:
// every package has a row, imports only what its row may import, and
// depends on nothing its row rules out.
func TestImportRules(t *testing.T) {
	root := repoRoot(t)
	page, err := os.ReadFile(filepath.Join(root, "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	rows, err := archcheck.ParseTable(string(page))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "list", "-f", "{{.ImportPath}}|{{join .Imports \" \"}}|{{join .Deps \" \"}}", "./...")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var pkgs []archcheck.Package
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Split(line, "|")
		path := archcheck.Own(module, f[:1])
		if len(path) == 0 {
			continue
		}
		pkgs = append(pkgs, archcheck.Package{Path: path[0],
			Imports: archcheck.Own(module, strings.Fields(f[1])), Deps: archcheck.Own(module, strings.Fields(f[2]))})
	}
	if len(pkgs) < 40 {
		t.Fatalf("go list found %d packages: not the whole module", len(pkgs))
	}
	for _, v := range archcheck.CheckImports(rows, pkgs) {
		t.Error(v)
	}
}

// TestCodeShape holds the size limits the architecture page states.
func TestCodeShape(t *testing.T) {
	over, err := archcheck.MeasureShape(repoRoot(t), archcheck.RepoLimits())
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range over {
		t.Error(o)
	}
}
