package nvml

import (
	"context"
	"reflect"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/warmfleet/warmfleet/schemas"
)

// fakeLibrary plays NVML: each field is what one call returns.
type fakeLibrary struct {
	init, shutdown nvmlReturn
	driver         string
	driverRet      nvmlReturn
	cuda           int
	cudaRet        nvmlReturn
	cards          []card
	countRet       nvmlReturn
	badCard        int // index whose read fails (-1: none)
	panicOn        string

	shutdowns int
}

func (f *fakeLibrary) Init() nvmlReturn { f.maybePanic("init"); return f.init }
func (f *fakeLibrary) Shutdown() nvmlReturn {
	f.shutdowns++
	return f.shutdown
}
func (f *fakeLibrary) DriverVersion() (string, nvmlReturn) { return f.driver, f.driverRet }
func (f *fakeLibrary) CUDADriverVersion() (int, nvmlReturn) {
	return f.cuda, f.cudaRet
}
func (f *fakeLibrary) DeviceCount() (int, nvmlReturn) {
	f.maybePanic("count")
	return len(f.cards), f.countRet
}
func (f *fakeLibrary) Device(i int) (string, uint64, nvmlReturn) {
	if i == f.badCard {
		return "", 0, errGPUIsLost
	}
	return f.cards[i].model, uint64(f.cards[i].memoryBytes), success
}
func (f *fakeLibrary) Describe(r nvmlReturn) string { return r.String() }
func (f *fakeLibrary) maybePanic(call string) {
	if f.panicOn == call {
		panic("binding bug in " + call)
	}
}

const (
	h100 = "NVIDIA H100 80GB HBM3"
	a100 = "NVIDIA A100-SXM4-40GB"
	gib  = int64(1) << 30
)

// healthy is a working driver with three cards of two kinds.
func healthy() *fakeLibrary {
	return &fakeLibrary{driver: "550.54.15", cuda: 12040, badCard: -1,
		cards: []card{{h100, 80 * gib}, {a100, 40 * gib}, {h100, 80 * gib}}}
}

func TestProbe_Classification(t *testing.T) {
	nvidia := func(devs ...schemas.AcceleratorDevice) schemas.AcceleratorFacts {
		return schemas.AcceleratorFacts{Established: true, Vendor: "nvidia", DriverVersion: "550.54.15", DriverCapability: "12.4", Devices: devs}
	}
	both := []schemas.AcceleratorDevice{{Model: a100, MemoryBytes: 40 * gib, Count: 1}, {Model: h100, MemoryBytes: 80 * gib, Count: 2}}
	cases := []struct {
		name         string
		lib          func(*fakeLibrary)
		want         schemas.AcceleratorFacts
		wantShutdown int
	}{
		{"LibraryAbsentLookedAndFoundNoDriver", func(f *fakeLibrary) { f.init = errLibraryNotFound },
			schemas.AcceleratorFacts{Established: true}, 0},
		{"DriverNotLoadedCouldNotLook", func(f *fakeLibrary) { f.init = errDriverNotLoaded }, schemas.AcceleratorFacts{}, 0},
		{"NoPermissionCouldNotLook", func(f *fakeLibrary) { f.init = errNoPermission }, schemas.AcceleratorFacts{}, 0},
		{"UnknownInitErrorCouldNotLook", func(f *fakeLibrary) { f.init = errUnknown }, schemas.AcceleratorFacts{}, 0},
		{"CardsGroupedByModelAndMemory", func(*fakeLibrary) {}, nvidia(both...), 1},
		{"DriverWithoutCards", func(f *fakeLibrary) { f.cards = nil }, nvidia(), 1},
		{"CUDAVersionUnknownLeavesCapabilityEmpty", func(f *fakeLibrary) { f.cudaRet = errNotSupported },
			schemas.AcceleratorFacts{Established: true, Vendor: "nvidia", DriverVersion: "550.54.15", Devices: both}, 1},
		{"LostCardNotCounted", func(f *fakeLibrary) { f.badCard = 1 }, nvidia(schemas.AcceleratorDevice{Model: h100, MemoryBytes: 80 * gib, Count: 2}), 1},
		{"DeviceCountFailsCouldNotLook", func(f *fakeLibrary) { f.countRet = errUnknown }, schemas.AcceleratorFacts{}, 1},
		{"DriverVersionFailsCouldNotLook", func(f *fakeLibrary) { f.driverRet = errUninitialized }, schemas.AcceleratorFacts{}, 1},
		{"PanicInInitRecovered", func(f *fakeLibrary) { f.panicOn = "init" }, schemas.AcceleratorFacts{}, 0},
		{"PanicAfterInitRecoveredAndShutDown", func(f *fakeLibrary) { f.panicOn = "count" }, schemas.AcceleratorFacts{}, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			lib := healthy()
			tc.lib(lib)
			p := &Probe{lib: lib, log: zaptest.NewLogger(t)}
			got := p.Probe(context.Background())
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("Probe = %+v\nwant    %+v", got, tc.want)
			}
			if lib.shutdowns != tc.wantShutdown {
				t.Fatalf("Shutdown called %d times, want %d (exactly once after a successful Init)", lib.shutdowns, tc.wantShutdown)
			}
		})
	}
}

func TestProbe_CancelledMidReadStatesNothing(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	lib := healthy()
	got := (&Probe{lib: lib, log: zaptest.NewLogger(t)}).Probe(ctx)
	if got.Established {
		t.Fatalf("Probe with an ended context = %+v, want nothing established", got)
	}
	if lib.shutdowns != 1 {
		t.Fatalf("Shutdown called %d times, want 1", lib.shutdowns)
	}
}

func TestCUDACapability(t *testing.T) {
	for v, want := range map[int]string{12040: "12.4", 11080: "11.8", 12000: "12.0", 13010: "13.1", 0: "", -1: ""} {
		if got := cudaCapability(v); got != want {
			t.Errorf("cudaCapability(%d) = %q, want %q", v, got, want)
		}
	}
}
