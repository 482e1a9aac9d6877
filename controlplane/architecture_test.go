package controlplane_test

import (
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/warmfleet/warmfleet/"

// TestImportRules holds the layering docs/architecture.md describes: each
// rule names packages (a prefix ending in "/..." covers a folder) and the
// warmfleet packages they must not depend on, directly or not.
func TestImportRules(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("the go tool is not on PATH")
	}
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Deps \" \"}}", module+"...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	deps := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		var own []string
		for _, d := range f[1:] {
			if strings.HasPrefix(d, module) {
				own = append(own, strings.TrimPrefix(d, module))
			}
		}
		deps[strings.TrimPrefix(f[0], module)] = own
	}
	rules := []struct {
		pkgs   []string // "x/..." covers x and everything under it
		except []string
		never  []string
		allow  []string // what never would rule out but may be imported
	}{
		{pkgs: []string{"residency/..."}, never: []string{"agent", "controlplane/..."}},
		{pkgs: []string{"nodelog"}, never: []string{"bus", "schemas", "noderuntime", "agent", "controlplane/...", "residency/...", "adapters/..."}},
		{pkgs: []string{"runlog"}, never: []string{"agent", "controlplane/...", "residency/...", "noderuntime", "nodelog"}},
		{pkgs: []string{"internal/..."}, except: []string{"internal/testenv"}, never: []string{"controlplane/...", "agent", "residency/..."}},
		{pkgs: []string{"noderuntime", "adapters/containerd"}, never: []string{"agent", "residency/...", "controlplane/..."}},
		// go-nvml and containerd's client must never share a binary
		// (adapters/nvml/doc.go); cmd/warmfleet-gpu-probe's tests check
		// the binaries themselves.
		{pkgs: []string{"adapters/nvml", "adapters/cdispec"}, never: []string{"agent", "adapters/containerd", "adapters/gpuprobe", "controlplane/...", "residency/..."}},
		{pkgs: []string{"adapters/gpuprobe", "adapters/containerd", "agent", "cmd/warmfleet-agent", "cmd/warmfleet"}, never: []string{"adapters/nvml"}},
		{pkgs: []string{"controlplane/lifecycle", "controlplane/placement"}, never: []string{"bus", "controlplane/..."}},
		{pkgs: []string{"controlplane/..."}, except: []string{"controlplane"}, never: []string{"controlplane", "agent"}},
		{pkgs: []string{"controlplane/scheduler"}, never: []string{"controlplane/rentals", "controlplane/nodes", "controlplane/sessions", "controlplane/intake", "controlplane/ingest"}},
		// The per-use credential services share nodecreds and know nothing
		// of each other or of the parts that book Runs.
		{pkgs: []string{"controlplane/nodecreds"}, never: []string{"controlplane/registryauth", "controlplane/artifactauth", "controlplane/prefetch", "controlplane/runs", "controlplane/dispatch", "controlplane/scheduler", "controlplane/intake", "controlplane/ingest", "controlplane/nodes", "controlplane/rentals", "controlplane/sessions", "controlplane/lifecycle", "controlplane/placement"}},
		{pkgs: []string{"controlplane/artifactauth"}, never: []string{"controlplane/registryauth", "controlplane/prefetch", "controlplane/runs", "controlplane/dispatch", "controlplane/scheduler", "controlplane/intake", "controlplane/ingest", "controlplane/nodes", "controlplane/rentals", "controlplane/sessions", "controlplane/lifecycle", "controlplane/placement"}},
		{pkgs: []string{"controlplane/registryauth"}, never: []string{"controlplane/artifactauth"}},
		{pkgs: []string{"controlplane/registryauth"}, never: []string{"controlplane/prefetch", "controlplane/runs", "controlplane/dispatch", "controlplane/scheduler", "controlplane/intake", "controlplane/ingest", "controlplane/nodes", "controlplane/rentals", "controlplane/sessions", "controlplane/lifecycle", "controlplane/placement"}},
		{pkgs: []string{"controlplane/runs", "controlplane/dispatch", "controlplane/cache"}, never: []string{"controlplane/scheduler", "controlplane/intake", "controlplane/ingest", "controlplane/nodes", "controlplane/rentals", "controlplane/sessions", "controlplane/prefetch", "controlplane/registryauth", "controlplane/artifactauth", "controlplane/nodecreds"}},
		// Prefetches reach nodes through dispatch and hear back through
		// ingest's Prefetches interface, never the other way round.
		{pkgs: []string{"controlplane/prefetch"}, never: []string{"controlplane/scheduler", "controlplane/intake", "controlplane/ingest", "controlplane/nodes", "controlplane/rentals", "controlplane/sessions", "controlplane/runs"}},
		{pkgs: []string{"controlplane/ingest"}, never: []string{"controlplane/prefetch"}},
		// The catalog is a leaf over its buckets (its service answers on the
		// request server); intake resolves through its own ArtifactResolver
		// interface.
		{pkgs: []string{"controlplane/artifacts"}, never: []string{"controlplane/...", "agent", "residency/..."}, allow: []string{"controlplane/requests"}},
		// The request server and the auth callout serve; they know no part.
		{pkgs: []string{"controlplane/requests", "controlplane/admission"}, never: []string{"controlplane/...", "agent", "residency/..."}},
		{pkgs: []string{"agent/artifactstore"}, never: []string{"agent", "controlplane/...", "residency/...", "noderuntime"}},
		{pkgs: []string{"controlplane/intake", "controlplane/runs", "controlplane/dispatch", "controlplane/scheduler", "controlplane/placement"}, never: []string{"controlplane/artifacts"}},
	}
	matches := func(pattern, pkg string) bool {
		if p, ok := strings.CutSuffix(pattern, "/..."); ok {
			return pkg == p || strings.HasPrefix(pkg, p+"/")
		}
		return pkg == pattern
	}
	matchesAny := func(patterns []string, pkg string) bool {
		for _, p := range patterns {
			if matches(p, pkg) {
				return true
			}
		}
		return false
	}
	checked := 0
	for pkg, ds := range deps {
		for _, r := range rules {
			if !matchesAny(r.pkgs, pkg) || matchesAny(r.except, pkg) {
				continue
			}
			checked++
			for _, d := range ds {
				if matchesAny(r.never, d) && !matchesAny(r.allow, d) {
					t.Errorf("%s depends on %s, which docs/architecture.md rules out", pkg, d)
				}
			}
		}
	}
	if checked < 10 {
		t.Fatalf("only %d packages matched a rule: the rules no longer name the tree", checked)
	}
}
