//go:build cgo

package nvml

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/warmfleet/warmfleet/schemas"
)

// TestSystemNVML_OnThisHost runs the real binding. On a machine without
// libnvidia-ml (CI) it must state Established with no vendor; on a GPU host
// it must name nvidia. Either way it must not crash.
func TestSystemNVML_OnThisHost(t *testing.T) {
	p := New(zaptest.NewLogger(t))
	for range 2 { // a second probe after shutdown works the same
		got := p.Probe(context.Background())
		t.Logf("system NVML: %+v", got)
		switch {
		case got.Established && got.Vendor == "":
			if len(got.Devices) != 0 || got.DriverVersion != "" {
				t.Fatalf("no-driver facts carry measurements: %+v", got)
			}
		case got.Established && got.Vendor == Vendor:
			if got.DriverVersion == "" {
				t.Fatalf("nvidia facts without a driver version: %+v", got)
			}
		case !got.Established:
			t.Log("NVML present but unusable here; stated nothing established")
		}
	}
}

func TestSystemNVML_MissingLibraryIsNoDriver(t *testing.T) {
	got := New(zaptest.NewLogger(t), WithLibrary(filepath.Join(t.TempDir(), "libnvidia-ml.so.1"))).Probe(context.Background())
	if !reflect.DeepEqual(got, schemas.AcceleratorFacts{Established: true}) {
		t.Fatalf("Probe = %+v, want established with no vendor", got)
	}
}

// fakeDriver is a libnvidia-ml stand-in in C: three cards of two models,
// driver 550.54.15, CUDA 12.4. Macros vary it per test.
const fakeDriver = `
#include <string.h>
typedef int nvmlReturn_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct card { const char *name; unsigned long long mem; } *nvmlDevice_t;
static struct card cards[] = {
	{"NVIDIA H100 80GB HBM3", 85520809984ULL},
	{"NVIDIA A100-SXM4-40GB", 42949672960ULL},
	{"NVIDIA H100 80GB HBM3", 85520809984ULL},
};
static int refs;
#ifndef INIT_RET
#define INIT_RET 0
#endif
nvmlReturn_t nvmlInit_v2(void) { if (INIT_RET == 0) refs++; return INIT_RET; }
nvmlReturn_t nvmlShutdown(void) { if (refs == 0) return 1; refs--; return 0; }
const char *nvmlErrorString(nvmlReturn_t r) { return r == 9 ? "Driver Not Loaded" : "Some NVML Error"; }
nvmlReturn_t nvmlSystemGetDriverVersion(char *v, unsigned int n) { if (!refs) return 1; strncpy(v, "550.54.15", n); return 0; }
nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { *v = 12040; return 0; }
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) { if (!refs) return 1; *n = 3; return 0; }
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) { if (i >= 3) return 2; *d = &cards[i]; return 0; }
#ifndef NO_NAME
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *v, unsigned int n) { strncpy(v, d->name, n); return 0; }
#endif
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) { m->total = d->mem; m->free = d->mem; m->used = 0; return 0; }
`

// buildFakeDriver compiles fakeDriver into a shared library.
func buildFakeDriver(t *testing.T, defines ...string) string {
	t.Helper()
	cc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("gcc not installed; cannot build a fake NVML library")
	}
	dir := t.TempDir()
	src, lib := filepath.Join(dir, "fake.c"), filepath.Join(dir, "libnvidia-ml.so.1")
	if err := os.WriteFile(src, []byte(fakeDriver), 0o644); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"-shared", "-fPIC", "-o", lib, src}, defines...)
	if out, err := exec.Command(cc, args...).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	return lib
}

// TestSystemNVML_FakeDriverLibrary drives the real dlopen binding against a
// library with NVML's ABI, which is as close to a GPU as this machine gets.
func TestSystemNVML_FakeDriverLibrary(t *testing.T) {
	t.Run("ReadsDriverAndCards", func(t *testing.T) {
		p := New(zaptest.NewLogger(t), WithLibrary(buildFakeDriver(t)))
		want := schemas.AcceleratorFacts{Established: true, Vendor: "nvidia", DriverVersion: "550.54.15", DriverCapability: "12.4",
			Devices: []schemas.AcceleratorDevice{
				{Model: "NVIDIA A100-SXM4-40GB", MemoryBytes: 42949672960, Count: 1},
				{Model: "NVIDIA H100 80GB HBM3", MemoryBytes: 85520809984, Count: 2},
			}}
		for range 2 { // init/shutdown balance: the second probe needs the first's shutdown
			if got := p.Probe(context.Background()); !reflect.DeepEqual(got, want) {
				t.Fatalf("Probe = %+v\nwant    %+v", got, want)
			}
		}
	})
	t.Run("DriverNotLoadedCouldNotLook", func(t *testing.T) {
		got := New(zaptest.NewLogger(t), WithLibrary(buildFakeDriver(t, "-DINIT_RET=9"))).Probe(context.Background())
		if got.Established {
			t.Fatalf("Probe = %+v, want nothing established", got)
		}
	})
	t.Run("LibraryLackingAnEntryPointCouldNotLook", func(t *testing.T) {
		got := New(zaptest.NewLogger(t), WithLibrary(buildFakeDriver(t, "-DNO_NAME"))).Probe(context.Background())
		if got.Established {
			t.Fatalf("Probe = %+v, want nothing established", got)
		}
	})
}
