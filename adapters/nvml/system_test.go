package nvml

import (
	"context"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"go.uber.org/zap/zaptest"

	"github.com/warmfleet/warmfleet/schemas"
)

// TestSystemNVML_OnThisHost runs go-nvml's real binding. On a machine
// without libnvidia-ml (CI) it must state Established with no vendor; on a
// GPU host it must name nvidia and each card's UUID. Either way it must not
// crash.
func TestSystemNVML_OnThisHost(t *testing.T) {
	p := New(nvml.New(), zaptest.NewLogger(t))
	for range 2 { // a second probe after shutdown works the same
		got := p.Probe(context.Background())
		t.Logf("system NVML: %+v", got)
		switch {
		case got.Established && got.Vendor == "":
			if len(got.Devices) != 0 || len(got.Cards) != 0 || got.DriverVersion != "" {
				t.Fatalf("no-driver facts carry measurements: %+v", got)
			}
		case got.Established && got.Vendor == Vendor:
			if got.DriverVersion == "" {
				t.Fatalf("nvidia facts without a driver version: %+v", got)
			}
			for _, c := range got.Cards {
				if c.Healthy() && c.UUID == "" {
					t.Fatalf("healthy card without a UUID: %+v", c)
				}
			}
		case !got.Established:
			t.Log("NVML present but unusable here; stated nothing established")
		}
	}
}

func TestSystemNVML_MissingLibraryIsNoDriver(t *testing.T) {
	lib := nvml.New(nvml.WithLibraryPath(filepath.Join(t.TempDir(), "libnvidia-ml.so.1")))
	got := New(lib, zaptest.NewLogger(t)).Probe(context.Background())
	if !reflect.DeepEqual(got, schemas.AcceleratorFacts{Established: true}) {
		t.Fatalf("Probe = %+v, want established with no vendor", got)
	}
}
