package archcheck

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
)

// Limits are the largest a type, function and file may grow.
type Limits struct {
	// Methods per named type and Lines per function (from `func` to its
	// closing brace), in the packages under Scoped.
	Methods, FuncLines int
	Scoped             []Pattern
	// FileLines per non-test Go file, anywhere.
	FileLines int
}

// MeasureShape walks the Go sources under root (skipping testdata and
// hidden folders) and returns one line per type, function or file past lim.
func MeasureShape(root string, lim Limits) ([]string, error) {
	var out []string
	methods := map[string]int{} // "pkg dir.Type"
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		if n := fset.File(f.Pos()).LineCount(); n > lim.FileLines {
			out = append(out, fmt.Sprintf("file %s: %d lines (limit %d)", rel, n, lim.FileLines))
		}
		dir := filepath.ToSlash(filepath.Dir(rel))
		if !slices.ContainsFunc(lim.Scoped, func(p Pattern) bool { return p.Matches(dir) }) {
			return nil
		}
		for _, decl := range f.Decls {
			fd, ok := decl.(*ast.FuncDecl)
			if !ok {
				continue
			}
			name := fd.Name.Name
			if t := receiver(fd); t != "" {
				methods[dir+"."+t]++
				name = t + "." + name
			}
			if n := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1; n > lim.FuncLines {
				out = append(out, fmt.Sprintf("func %s %s: %d lines (limit %d)", rel, name, n, lim.FuncLines))
			}
		}
		return nil
	})
	for t, n := range methods {
		if n > lim.Methods {
			out = append(out, fmt.Sprintf("type %s: %d methods (limit %d)", t, n, lim.Methods))
		}
	}
	slices.Sort(out)
	return out, err
}

// receiver names a method's receiver type; "" for a function.
func receiver(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return ""
	}
	t := fd.Recv.List[0].Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	switch g := t.(type) {
	case *ast.IndexExpr:
		t = g.X
	case *ast.IndexListExpr:
		t = g.X
	}
	if id, ok := t.(*ast.Ident); ok {
		return id.Name
	}
	return ""
}

// RepoLimits are this repository's limits, as docs/architecture.md states
// them.
func RepoLimits() Limits {
	return Limits{
		Methods: 30, FuncLines: 80, FileLines: 500,
		Scoped: []Pattern{"agent/…", "adapters/containerd", "controlplane/…", "cmd/warmfleet-bench/…"},
	}
}
