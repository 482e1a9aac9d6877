package main

import (
	"bytes"
	"context"
	"os/exec"
	"reflect"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"go.uber.org/zap/zaptest"

	"github.com/warmfleet/warmfleet/adapters/gpuprobe"
	wfnvml "github.com/warmfleet/warmfleet/adapters/nvml"
)

// TestRun_JSONRoundTrip: what the probe prints for go-nvml's DGX A100 mock
// is what the agent's decoder reads back, card for card.
func TestRun_JSONRoundTrip(t *testing.T) {
	s := dgxa100.New()
	for _, d := range s.Devices {
		d := d.(*dgxa100.Device)
		d.GetRetiredPagesPendingStatusFunc = func() (nvml.EnableState, nvml.Return) { return nvml.FEATURE_DISABLED, nvml.SUCCESS }
		d.GetRemappedRowsFunc = func() (int, int, bool, bool, nvml.Return) { return 0, 0, false, false, nvml.SUCCESS }
	}
	var out bytes.Buffer
	if err := run(context.Background(), &out, s, zaptest.NewLogger(t), 0, false); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(out.String(), "\n"); n != 1 {
		t.Fatalf("the probe printed %d lines, want one JSON line:\n%s", n, out.String())
	}
	got, err := gpuprobe.Decode(out.Bytes())
	if err != nil {
		t.Fatalf("the agent cannot read the probe's output: %v\n%s", err, out.String())
	}
	want := wfnvml.New(s, zaptest.NewLogger(t), wfnvml.WithXIDWindow(0)).Probe(context.Background())
	if !reflect.DeepEqual(got, want) || got.GPUCount() != 8 || len(got.Cards) != 8 || got.Cards[7].UUID == "" {
		t.Fatalf("decoded\n%+v\nwant\n%+v", got, want)
	}
}

// TestDeps_NVMLAndContainerdNeverShareABinary holds the split
// adapters/nvml/doc.go explains: go-nvml in a binary that links
// containerd's client dies at exec on hosts without the driver.
func TestDeps_NVMLAndContainerdNeverShareABinary(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("the go tool is not on PATH")
	}
	deps := func(pkg string) []string {
		out, err := exec.Command("go", "list", "-deps", pkg).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", pkg, err)
		}
		return strings.Fields(string(out))
	}
	for _, d := range deps("github.com/warmfleet/warmfleet/cmd/warmfleet-gpu-probe") {
		if strings.HasPrefix(d, "github.com/containerd/") || d == "plugin" {
			t.Errorf("warmfleet-gpu-probe links %s", d)
		}
	}
	sawNVML := false
	for _, bin := range []string{"warmfleet-agent", "warmfleet", "warmfleet-bench"} {
		for _, d := range deps("github.com/warmfleet/warmfleet/cmd/" + bin) {
			if strings.HasPrefix(d, "github.com/NVIDIA/go-nvml") || d == "github.com/warmfleet/warmfleet/adapters/nvml" {
				t.Errorf("%s links %s", bin, d)
			}
		}
	}
	for _, d := range deps("github.com/warmfleet/warmfleet/cmd/warmfleet-gpu-probe") {
		sawNVML = sawNVML || d == "github.com/NVIDIA/go-nvml/pkg/nvml"
	}
	if !sawNVML {
		t.Error("the probe no longer links go-nvml: this test checks nothing")
	}
}

// TestProbeBinary_NoDriverHere builds and runs the probe: on a host
// without libnvidia-ml it prints {"established":true} and exits 0; on a
// GPU host it names the cards.
func TestProbeBinary_NoDriverHere(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("the go tool is not on PATH")
	}
	bin := t.TempDir() + "/probe"
	if b, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	out, err := exec.Command(bin, "--xid-window=0").Output()
	if err != nil {
		t.Fatalf("probe: %v", err)
	}
	facts, err := gpuprobe.Decode(out)
	if err != nil || !facts.Established {
		t.Fatalf("probe printed %q (%v), want established facts", out, err)
	}
	t.Logf("probe on this host: %s", out)
	if facts.Vendor == "" && string(out) != "{\"established\":true}\n" {
		t.Fatalf("no-driver output %q", out)
	}
	// A library path that does not exist is a host without the driver.
	out, err = exec.Command(bin, "--xid-window=0", "--nvml-library="+t.TempDir()+"/libnvidia-ml.so.1").Output()
	if err != nil || string(out) != "{\"established\":true}\n" {
		t.Fatalf("missing library: %q, %v", out, err)
	}
	if err := exec.Command(bin, "extra-arg").Run(); err == nil {
		t.Fatal("the probe accepted an argument")
	}
}
