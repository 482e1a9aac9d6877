package archcheck

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const page = "# A\n\n## Packages\n\n" +
	"| package | owns | may import |\n| --- | --- | --- |\n" +
	"| `schemas` | wire types | `bus/codec` |\n" +
	"| `bus`, `bus/codec` | NATS | `bus/codec` |\n" +
	"| `agent/…` | the agent; see `Runtime` in notes | `bus/…`, `schemas`; never `controlplane/…` |\n" +
	"| `controlplane/…` | the control plane | `bus/…`, `schemas`, `controlplane/…` |\n" +
	"| `controlplane/placement` | decisions | `schemas` |\n" +
	"| `cmd/tool` | a binary | anything; never `agent/…` |\n" +
	"| `deploy` | files | nothing of ours |\n\n## Next\n\n| not | a | row |\n"

var fleet = []Package{
	{Path: "schemas", Imports: []string{"bus/codec"}, Deps: []string{"bus/codec"}},
	{Path: "bus", Imports: []string{"bus/codec"}, Deps: []string{"bus/codec"}},
	{Path: "bus/codec"},
	{Path: "agent", Imports: []string{"bus", "schemas"}, Deps: []string{"bus", "bus/codec", "schemas"}},
	{Path: "agent/store", Imports: []string{"schemas"}, Deps: []string{"schemas", "bus/codec"}},
	{Path: "controlplane", Imports: []string{"controlplane/placement", "bus", "schemas"}, Deps: []string{"controlplane/placement", "bus", "bus/codec", "schemas"}},
	{Path: "controlplane/placement", Imports: []string{"schemas"}, Deps: []string{"schemas", "bus/codec"}},
	{Path: "cmd/tool", Imports: []string{"controlplane"}, Deps: []string{"controlplane", "controlplane/placement", "bus", "bus/codec", "schemas"}},
	{Path: "deploy"},
}

func parse(t *testing.T, p string) []Row {
	t.Helper()
	rows, err := ParseTable(p)
	if err != nil {
		t.Fatal(err)
	}
	return rows
}

func TestParseTable(t *testing.T) {
	rows := parse(t, page)
	if len(rows) != 7 {
		t.Fatalf("%d rows, want 7 (the table under Packages only)", len(rows))
	}
	a := rows[2]
	if !slices.Equal(a.MayImport, []Pattern{"bus/…", "schemas"}) || !slices.Equal(a.Never, []Pattern{"controlplane/…"}) || a.Anything {
		t.Errorf("agent row: %+v", a)
	}
	if c := rows[5]; !c.Anything || !slices.Equal(c.Never, []Pattern{"agent/…"}) {
		t.Errorf("cmd row: %+v", c)
	}
	if d := rows[6]; d.Anything || len(d.MayImport) != 0 {
		t.Errorf("deploy row: %+v", d)
	}
}

func TestParseTableRefusesAnUncheckableRow(t *testing.T) {
	for _, bad := range []string{
		"| `x` | y | whatever it needs |",
		"| x | y | `schemas` |",
		"| `x` | `schemas` |",
	} {
		p := "## Packages\n| package | owns | may import |\n| --- | --- | --- |\n" + bad + "\n"
		if _, err := ParseTable(p); err == nil {
			t.Errorf("%q parsed; want an error", bad)
		}
	}
	if _, err := ParseTable("# no table\n"); err == nil {
		t.Error("a page without a package table parsed")
	}
}

func TestCheckImportsPassesATrueTable(t *testing.T) {
	if v := CheckImports(parse(t, page), fleet); len(v) != 0 {
		t.Fatalf("violations on a true table: %q", v)
	}
}

// The rule the test exists for: an import the table does not list fails.
func TestCheckImportsFindsAnImportOutsideTheTable(t *testing.T) {
	pkgs := slices.Clone(fleet)
	pkgs[6] = Package{Path: "controlplane/placement", Imports: []string{"schemas", "bus"}, Deps: []string{"schemas", "bus", "bus/codec"}}
	v := CheckImports(parse(t, page), pkgs)
	if len(v) != 1 || !strings.Contains(v[0], "controlplane/placement imports bus") {
		t.Fatalf("violations %q; want the one import of bus by controlplane/placement (its exact row wins over controlplane/…)", v)
	}
}

func TestCheckImportsFindsNeverThroughAnother(t *testing.T) {
	pkgs := append(slices.Clone(fleet), Package{Path: "agent/x", Imports: []string{"bus"}, Deps: []string{"bus", "controlplane/placement"}})
	v := CheckImports(parse(t, page), pkgs)
	if len(v) != 1 || !strings.Contains(v[0], "agent/x depends on controlplane/placement") {
		t.Fatalf("violations %q; want agent/x's indirect dependency ruled out", v)
	}
}

func TestCheckImportsFindsMissingRowsAndStaleNames(t *testing.T) {
	pkgs := append(slices.Clone(fleet), Package{Path: "runlog"})
	p := strings.Replace(page, "| `deploy` |", "| `deploy`, `gone` |", 1)
	v := CheckImports(parse(t, p), pkgs)
	slices.Sort(v)
	if len(v) != 2 || !strings.Contains(v[0], "`gone`") || !strings.Contains(v[1], "runlog has no row") {
		t.Fatalf("violations %q; want the stale name and the package without a row", v)
	}
}

func TestCheckImportsFindsAListedImportNoneUses(t *testing.T) {
	p := strings.Replace(page, "| decisions | `schemas` |", "| decisions | `schemas`, `bus` |", 1)
	v := CheckImports(parse(t, p), fleet)
	if len(v) != 1 || !strings.Contains(v[0], "lists `bus`") {
		t.Fatalf("violations %q; want the unused may-import entry", v)
	}
}

func TestMeasureShape(t *testing.T) {
	root := t.TempDir()
	write := func(rel, body string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(root, filepath.Dir(rel)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, rel), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var methods strings.Builder
	methods.WriteString("package a\n\ntype T[K any] struct{}\n")
	for i := range 4 {
		methods.WriteString("func (t *T[K]) M" + string(rune('a'+i)) + "() {}\n")
	}
	write("agent/a.go", methods.String())
	write("agent/long.go", "package a\n\nfunc long() {\n"+strings.Repeat("\t_ = 1\n", 5)+"}\n")
	write("other/long.go", "package o\n\nfunc long() {\n"+strings.Repeat("\t_ = 1\n", 5)+"}\n")
	write("other/big.go", "package o\n"+strings.Repeat("\n", 20))
	write("other/big_test.go", "package o\n"+strings.Repeat("\n", 20))
	write("other/testdata/x.go", "package broken(")
	got, err := MeasureShape(root, Limits{Methods: 3, FuncLines: 6, FileLines: 12, Scoped: []Pattern{"agent/…"}})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"file other/big.go: 21 lines (limit 12)",
		"func agent/long.go long: 7 lines (limit 6)",
		"type agent.T: 4 methods (limit 3)",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("got %q\nwant %q", got, want)
	}
}
