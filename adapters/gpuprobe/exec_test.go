package gpuprobe

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/warmfleet/warmfleet/adapters/cdispec"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/schemas"
)

// script writes an executable shell script running body and returns its
// path.
func script(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "probe.sh")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// printing is a script that prints facts as the probe binary would.
func printing(t *testing.T, facts schemas.AcceleratorFacts) string {
	t.Helper()
	b, err := json.Marshal(facts)
	if err != nil {
		t.Fatal(err)
	}
	return script(t, "cat <<'FACTS'\n"+string(b)+"\nFACTS")
}

// twoCards is what a probe states for the testenv CDI fixture's two cards.
func twoCards(gpus testenv.CDIGPUs) schemas.AcceleratorFacts {
	c := func(i int) schemas.GPUCard {
		return schemas.GPUCard{Index: i, UUID: gpus.UUIDs[i], Model: "NVIDIA H100 80GB HBM3", MemoryBytes: 80 << 30,
			MIGMode: schemas.MIGDisabled, Health: schemas.GPUHealthOK}
	}
	cards := []schemas.GPUCard{c(0), c(1)}
	return schemas.AcceleratorFacts{Established: true, Vendor: "nvidia", DriverVersion: "550.54.15", DriverCapability: "12.4",
		Devices: schemas.GroupCards(cards), Cards: cards}
}

func TestExec_AddsCDINamesToTheProbesCards(t *testing.T) {
	gpus := testenv.WriteCDIGPUs(t)
	bad := testenv.WriteMalformedCDISpec(t, gpus.Dir)
	e := NewExec(ExecConfig{Path: printing(t, twoCards(gpus)), CDI: cdispec.New([]string{gpus.Dir}, zaptest.NewLogger(t)), Log: zaptest.NewLogger(t)})
	got := e.Probe(context.Background())
	if !got.Established || got.GPUCount() != 2 || len(got.Cards) != 2 {
		t.Fatalf("Probe = %+v", got)
	}
	for i, c := range got.Cards {
		want := []string{gpus.ByUUID(i), gpus.ByIndex(i)}
		if !reflect.DeepEqual(c.CDIDevices, want) || !c.Injectable() {
			t.Errorf("card %d CDI names %v, want %v", i, c.CDIDevices, want)
		}
	}
	if !got.CDI.Scanned || len(got.CDI.Devices) != 5 || len(got.CDI.Errors) != 1 || got.CDI.Errors[0].Path != bad {
		t.Errorf("CDI facts %+v, want 5 devices and the broken spec reported", got.CDI)
	}
}

func TestExec_CardsWithoutACDISpecHaveNoNames(t *testing.T) {
	gpus := testenv.WriteCDIGPUs(t)
	e := NewExec(ExecConfig{Path: printing(t, twoCards(gpus)), CDI: cdispec.New([]string{t.TempDir()}, zaptest.NewLogger(t)), Log: zaptest.NewLogger(t)})
	got := e.Probe(context.Background())
	if got.GPUCount() != 2 || !got.CDI.Scanned || len(got.CDI.Devices) != 0 {
		t.Fatalf("Probe = %+v", got)
	}
	for _, c := range got.Cards {
		if len(c.CDIDevices) != 0 || c.Injectable() {
			t.Errorf("card %d has CDI names %v with no spec on the host", c.Index, c.CDIDevices)
		}
	}
	// And a probe without a registry states CDI unscanned.
	got = NewExec(ExecConfig{Path: printing(t, twoCards(gpus)), Log: zaptest.NewLogger(t)}).Probe(context.Background())
	if got.CDI.Scanned || got.GPUCount() != 2 {
		t.Fatalf("no registry: %+v", got)
	}
}

// TestExec_RealProbeBinary runs the real probe: on this machine (no
// driver) it states Established with no vendor, and the CDI specs are
// still reported; on a GPU host it names each card.
func TestExec_RealProbeBinary(t *testing.T) {
	gpus := testenv.WriteCDIGPUs(t)
	bin := testenv.BuildGPUProbe(t)
	e := NewExec(ExecConfig{Path: bin, Args: []string{"--xid-window=0"}, CDI: cdispec.New([]string{gpus.Dir}, zaptest.NewLogger(t)), Log: zaptest.NewLogger(t)})
	got := e.Probe(context.Background())
	t.Logf("real probe: %+v", got)
	if !got.Established {
		t.Fatalf("the real probe could not look: %+v", got)
	}
	if !got.CDI.Scanned || len(got.CDI.Devices) != 5 {
		t.Fatalf("CDI facts %+v", got.CDI)
	}
	if got.Vendor == "" {
		if len(got.Cards) != 0 || len(got.Devices) != 0 {
			t.Fatalf("no driver, yet cards: %+v", got)
		}
		return
	}
	for _, c := range got.Cards {
		if c.Healthy() && c.UUID == "" {
			t.Fatalf("healthy card without a UUID: %+v", c)
		}
	}
}

func observed(t *testing.T) (*zap.Logger, *observer.ObservedLogs) {
	core, logs := observer.New(zap.DebugLevel)
	return zap.New(core), logs
}

func TestExec_MissingBinaryStatesNothingAndSaysSo(t *testing.T) {
	log, logs := observed(t)
	e := NewExec(ExecConfig{Path: filepath.Join(t.TempDir(), BinaryName), Log: log})
	for range 3 {
		if got := e.Probe(context.Background()); !reflect.DeepEqual(got, schemas.AcceleratorFacts{}) {
			t.Fatalf("missing binary stated %+v", got)
		}
	}
	warns := logs.FilterLevelExact(zap.WarnLevel).All()
	if len(warns) != 1 || !strings.Contains(warns[0].Message, "binary missing") {
		t.Fatalf("warnings %+v, want one saying the binary is missing", warns)
	}
	if _, err := Locate(filepath.Join(t.TempDir(), "nope")); !errors.Is(err, ErrProbeMissing) {
		t.Fatalf("Locate of a missing path: %v", err)
	}
}

func TestExec_HungBinaryIsKilledAtTheTimeout(t *testing.T) {
	e := NewExec(ExecConfig{Path: script(t, "echo starting >&2; sleep 60"), Timeout: 300 * time.Millisecond, Log: zaptest.NewLogger(t)})
	start := time.Now()
	got := e.Probe(context.Background())
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("a hung probe held Probe for %v", took)
	}
	if got.Established {
		t.Fatalf("hung probe stated %+v", got)
	}
	// The caller's context bounds it too.
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	e = NewExec(ExecConfig{Path: script(t, "exec sleep 60"), Timeout: time.Minute, Log: zaptest.NewLogger(t)})
	start = time.Now()
	if got := e.Probe(ctx); got.Established || time.Since(start) > 5*time.Second {
		t.Fatalf("Probe past its context: %+v after %v", got, time.Since(start))
	}
}

func TestExec_BadRunsStateNothing(t *testing.T) {
	for name, body := range map[string]string{
		"ExitNonZero":    `echo '{"established":true}'; exit 3`,
		"Garbage":        `echo 'NVML says hi'`,
		"TwoObjects":     `echo '{"established":true}{"established":true}'`,
		"UnknownField":   `echo '{"established":true,"gpus":8}'`,
		"CardsNoVendor":  `echo '{"established":true,"cards":[{"index":0,"uuid":"GPU-1","health":"ok"}]}'`,
		"HugeOutput":     `yes '{"established":true}' | head -c 2000000`,
		"Crash":          `kill -SEGV $$`,
		"RepeatedIndex":  `echo '{"established":true,"vendor":"nvidia","cards":[{"index":0,"health":"ok"},{"index":0,"health":"ok"}]}'`,
		"NegativeMemory": `echo '{"established":true,"vendor":"nvidia","cards":[{"index":0,"health":"ok","memory_bytes":-1}]}'`,
	} {
		t.Run(name, func(t *testing.T) {
			e := NewExec(ExecConfig{Path: script(t, body), Log: zaptest.NewLogger(t)})
			if got := e.Probe(context.Background()); got.Established {
				t.Fatalf("stated %+v", got)
			}
		})
	}
}

func TestLocate_FindsTheProbeOnPATH(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, BinaryName)
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir)
	got, err := Locate("")
	if err != nil || got != p {
		t.Fatalf("Locate = %q, %v; want %s", got, err, p)
	}
	if got, err := Locate(p); err != nil || got != p {
		t.Fatalf("Locate(%s) = %q, %v", p, got, err)
	}
}
