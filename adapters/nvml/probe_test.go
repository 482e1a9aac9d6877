package nvml

import (
	"cmp"
	"context"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"go.uber.org/zap/zaptest"

	"github.com/warmfleet/warmfleet/schemas"
)

const (
	a100Model = "Mock NVIDIA A100-SXM4-40GB" // dgxa100's card name
	a100Bytes = int64(40960) << 20
)

// dgx is go-nvml's DGX A100 mock (8 A100s with UUIDs, driver 550.54.15,
// CUDA 12.4), completed with the calls the mock leaves out: health checks
// that pass, XID event registration, and MIG device handles derived from
// the GPU and compute instances a test creates.
func dgx(t *testing.T) *dgxa100.Server {
	t.Helper()
	s := dgxa100.New()
	for _, d := range s.Devices {
		completeDevice(d.(*dgxa100.Device))
	}
	return s
}

func completeDevice(d *dgxa100.Device) {
	d.GetRetiredPagesPendingStatusFunc = func() (nvml.EnableState, nvml.Return) { return nvml.FEATURE_DISABLED, nvml.SUCCESS }
	d.GetRemappedRowsFunc = func() (int, int, bool, bool, nvml.Return) { return 0, 0, false, false, nvml.SUCCESS }
	d.RegisterEventsFunc = func(uint64, nvml.EventSet) nvml.Return { return nvml.SUCCESS }
	d.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { return 7, nvml.SUCCESS }
	d.GetGpuInstanceByIdFunc = func(id int) (nvml.GpuInstance, nvml.Return) {
		for _, gi := range gpuInstances(d) {
			if int(gi.Info.Id) == id {
				return gi, nvml.SUCCESS
			}
		}
		return nil, nvml.ERROR_NOT_FOUND
	}
	d.GetMigDeviceHandleByIndexFunc = func(j int) (nvml.Device, nvml.Return) {
		var migs []nvml.Device
		for _, gi := range gpuInstances(d) {
			for _, ci := range computeInstances(gi) {
				migs = append(migs, migHandle(d, gi, ci))
			}
		}
		if j < 0 || j >= len(migs) {
			return nil, nvml.ERROR_NOT_FOUND
		}
		return migs[j], nvml.SUCCESS
	}
}

// gpuInstances are d's GPU instances by id, each able to find its compute
// instances by id.
func gpuInstances(d *dgxa100.Device) []*dgxa100.GpuInstance {
	d.RLock()
	defer d.RUnlock()
	var out []*dgxa100.GpuInstance
	for gi := range d.GpuInstances {
		gi.GetComputeInstanceByIdFunc = func(id int) (nvml.ComputeInstance, nvml.Return) {
			for _, ci := range computeInstances(gi) {
				if int(ci.Info.Id) == id {
					return ci, nvml.SUCCESS
				}
			}
			return nil, nvml.ERROR_NOT_FOUND
		}
		out = append(out, gi)
	}
	slices.SortFunc(out, func(a, b *dgxa100.GpuInstance) int { return cmp.Compare(a.Info.Id, b.Info.Id) })
	return out
}

func computeInstances(gi *dgxa100.GpuInstance) []*dgxa100.ComputeInstance {
	gi.RLock()
	defer gi.RUnlock()
	var out []*dgxa100.ComputeInstance
	for ci := range gi.ComputeInstances {
		out = append(out, ci)
	}
	slices.SortFunc(out, func(a, b *dgxa100.ComputeInstance) int { return cmp.Compare(a.Info.Id, b.Info.Id) })
	return out
}

// migHandle is the MIG device of compute instance ci in gi on d.
func migHandle(d *dgxa100.Device, gi *dgxa100.GpuInstance, ci *dgxa100.ComputeInstance) nvml.Device {
	giProfile := d.Config.MIGProfiles.GpuInstanceProfiles[int(gi.Info.ProfileId)]
	return &mock.Device{
		GetUUIDFunc: func() (string, nvml.Return) {
			return "MIG-" + strings.TrimPrefix(d.UUID, "GPU-")[:8] + "-" + string(rune('a'+gi.Info.Id)) + string(rune('a'+ci.Info.Id)), nvml.SUCCESS
		},
		GetGpuInstanceIdFunc:     func() (int, nvml.Return) { return int(gi.Info.Id), nvml.SUCCESS },
		GetComputeInstanceIdFunc: func() (int, nvml.Return) { return int(ci.Info.Id), nvml.SUCCESS },
		GetMemoryInfoFunc: func() (nvml.Memory, nvml.Return) {
			return nvml.Memory{Total: giProfile.MemorySizeMB << 20}, nvml.SUCCESS
		},
	}
}

// carve enables MIG on d and creates a GPU instance of giProfile holding
// one compute instance of ciProfile.
func carve(t *testing.T, d *dgxa100.Device, giProfile, ciProfile int) {
	t.Helper()
	if ret, _ := d.SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS {
		t.Fatalf("SetMigMode: %v", ret)
	}
	info, ret := d.GetGpuInstanceProfileInfo(giProfile)
	if ret != nvml.SUCCESS {
		t.Fatalf("GPU instance profile %d: %v", giProfile, ret)
	}
	gi, ret := d.CreateGpuInstance(&info)
	if ret != nvml.SUCCESS {
		t.Fatalf("CreateGpuInstance: %v", ret)
	}
	ciInfo, ret := gi.GetComputeInstanceProfileInfo(ciProfile, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	if ret != nvml.SUCCESS {
		t.Fatalf("compute instance profile %d: %v", ciProfile, ret)
	}
	if _, ret := gi.CreateComputeInstance(&ciInfo); ret != nvml.SUCCESS {
		t.Fatalf("CreateComputeInstance: %v", ret)
	}
}

func probe(t *testing.T, lib nvml.Interface, opts ...Option) schemas.AcceleratorFacts {
	t.Helper()
	return New(lib, zaptest.NewLogger(t), append([]Option{WithXIDWindow(0)}, opts...)...).Probe(context.Background())
}

func TestProbe_DGXA100(t *testing.T) {
	s := dgx(t)
	got := probe(t, s)
	if !got.Established || got.Vendor != "nvidia" || got.DriverVersion != "550.54.15" || got.DriverCapability != "12.4" {
		t.Fatalf("driver facts %+v", got)
	}
	want := []schemas.AcceleratorDevice{{Model: a100Model, MemoryBytes: a100Bytes, Count: 8}}
	if !reflect.DeepEqual(got.Devices, want) {
		t.Fatalf("Devices = %+v, want %+v", got.Devices, want)
	}
	if len(got.Cards) != 8 {
		t.Fatalf("%d cards, want 8", len(got.Cards))
	}
	seen := map[string]bool{}
	for i, c := range got.Cards {
		uuid := s.Devices[i].(*dgxa100.Device).UUID
		wantCard := schemas.GPUCard{Index: i, UUID: uuid, Model: a100Model, MemoryBytes: a100Bytes,
			MIGMode: schemas.MIGDisabled, Health: schemas.GPUHealthOK}
		if !reflect.DeepEqual(c, wantCard) {
			t.Errorf("card %d = %+v\nwant    %+v", i, c, wantCard)
		}
		if !strings.HasPrefix(c.UUID, "GPU-") || seen[c.UUID] {
			t.Errorf("card %d UUID %q: not a unique GPU UUID", i, c.UUID)
		}
		seen[c.UUID] = true
	}
}

func TestProbe_MIGInstances(t *testing.T) {
	s := dgx(t)
	d0 := s.Devices[0].(*dgxa100.Device)
	carve(t, d0, nvml.GPU_INSTANCE_PROFILE_1_SLICE, nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE)
	carve(t, d0, nvml.GPU_INSTANCE_PROFILE_3_SLICE, nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE)
	carve(t, d0, nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE)
	got := probe(t, s)
	c := got.Cards[0]
	if c.MIGMode != schemas.MIGEnabled || !c.Healthy() {
		t.Fatalf("card 0 = %+v, want MIG enabled and healthy", c)
	}
	if len(c.MIGDevices) != 3 {
		t.Fatalf("MIG devices %+v, want 3", c.MIGDevices)
	}
	wantProfiles := []string{"1g.5gb", "1c.3g.20gb", "1g.5gb+me"}
	wantMem := []int64{4864 << 20, 19968 << 20, 4864 << 20}
	for j, m := range c.MIGDevices {
		if m.Index != j || m.GPUInstanceID != j || m.ComputeInstanceID != 0 || !strings.HasPrefix(m.UUID, "MIG-") {
			t.Errorf("MIG device %d = %+v", j, m)
		}
		if m.Profile != wantProfiles[j] || m.MemoryBytes != wantMem[j] {
			t.Errorf("MIG device %d profile %q memory %d, want %q %d", j, m.Profile, m.MemoryBytes, wantProfiles[j], wantMem[j])
		}
	}
	if got.Cards[1].MIGMode != schemas.MIGDisabled || len(got.Cards[1].MIGDevices) != 0 {
		t.Errorf("card 1 = %+v, want MIG disabled", got.Cards[1])
	}
	if got.GPUCount() != 8 {
		t.Errorf("a MIG card still counts as one card: %d", got.GPUCount())
	}
}

func TestProbe_Health(t *testing.T) {
	s := dgx(t)
	dev := func(i int) *dgxa100.Device { return s.Devices[i].(*dgxa100.Device) }
	dev(2).GetRetiredPagesPendingStatusFunc = func() (nvml.EnableState, nvml.Return) { return nvml.FEATURE_ENABLED, nvml.SUCCESS }
	dev(3).GetRemappedRowsFunc = func() (int, int, bool, bool, nvml.Return) { return 1, 0, true, false, nvml.SUCCESS }
	dev(4).GetRemappedRowsFunc = func() (int, int, bool, bool, nvml.Return) { return 0, 3, false, true, nvml.SUCCESS }
	// Card 1 supports neither check: that is not a fault.
	dev(1).GetRetiredPagesPendingStatusFunc = func() (nvml.EnableState, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
	dev(1).GetRemappedRowsFunc = func() (int, int, bool, bool, nvml.Return) { return 0, 0, false, false, nvml.ERROR_NOT_SUPPORTED }
	lost := s.DeviceGetHandleByIndexFunc
	s.DeviceGetHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		if i == 5 {
			return nil, nvml.ERROR_GPU_IS_LOST
		}
		return lost(i)
	}
	// One XID critical error on card 6, an application XID on card 7.
	events := []nvml.EventData{
		{Device: dev(7), EventType: nvml.EventTypeXidCriticalError, EventData: 13},
		{Device: dev(6), EventType: nvml.EventTypeXidCriticalError, EventData: 79},
	}
	freed := 0
	s.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) {
		return &mock.EventSet{
			WaitFunc: func(uint32) (nvml.EventData, nvml.Return) {
				if len(events) == 0 {
					return nvml.EventData{}, nvml.ERROR_TIMEOUT
				}
				e := events[0]
				events = events[1:]
				return e, nvml.SUCCESS
			},
			FreeFunc: func() nvml.Return { freed++; return nvml.SUCCESS },
		}, nvml.SUCCESS
	}
	got := probe(t, s, WithXIDWindow(time.Second))
	wantReasons := map[int]string{
		2: "retired pages pending",
		3: "remapped rows pending",
		4: "row remapping failed",
		5: "unreadable: nvml device handle",
		6: "XID 79 critical error",
	}
	for _, c := range got.Cards {
		want, bad := wantReasons[c.Index]
		switch {
		case bad && (c.Healthy() || !strings.HasPrefix(c.Health, want) || strings.Contains(c.Health, ";")):
			t.Errorf("card %d = %+v, want unhealthy for one reason: %q", c.Index, c, want)
		case !bad && c.Health != schemas.GPUHealthOK:
			t.Errorf("card %d = %+v, want healthy", c.Index, c)
		}
	}
	if c := got.Cards[5]; c.UUID != "" || c.Model != "" {
		t.Errorf("the lost card names itself: %+v", c)
	}
	// The lost card is not counted; unhealthy but readable cards are.
	if got.GPUCount() != 7 {
		t.Errorf("GPUCount %d, want 7", got.GPUCount())
	}
	if freed != 1 {
		t.Errorf("event set freed %d times, want 1", freed)
	}
}

func TestProbe_Classification(t *testing.T) {
	cases := []struct {
		name         string
		spoil        func(*dgxa100.Server)
		want         schemas.AcceleratorFacts
		wantShutdown int
	}{
		{"LibraryAbsentLookedAndFoundNoDriver", func(s *dgxa100.Server) {
			s.InitFunc = func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }
		}, schemas.AcceleratorFacts{Established: true}, 0},
		{"DriverNotLoadedCouldNotLook", func(s *dgxa100.Server) {
			s.InitFunc = func() nvml.Return { return nvml.ERROR_DRIVER_NOT_LOADED }
		}, schemas.AcceleratorFacts{}, 0},
		{"NoPermissionCouldNotLook", func(s *dgxa100.Server) {
			s.InitFunc = func() nvml.Return { return nvml.ERROR_NO_PERMISSION }
		}, schemas.AcceleratorFacts{}, 0},
		{"DriverVersionFailsCouldNotLook", func(s *dgxa100.Server) {
			s.SystemGetDriverVersionFunc = func() (string, nvml.Return) { return "", nvml.ERROR_UNKNOWN }
		}, schemas.AcceleratorFacts{}, 1},
		{"DeviceCountFailsCouldNotLook", func(s *dgxa100.Server) {
			s.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
		}, schemas.AcceleratorFacts{}, 1},
		{"DriverWithoutCards", func(s *dgxa100.Server) {
			s.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, nvml.SUCCESS }
		}, schemas.AcceleratorFacts{Established: true, Vendor: "nvidia", DriverVersion: "550.54.15", DriverCapability: "12.4", Cards: []schemas.GPUCard{}}, 1},
		{"PanicInInitRecovered", func(s *dgxa100.Server) {
			s.InitFunc = func() nvml.Return { panic("binding bug") }
		}, schemas.AcceleratorFacts{}, 0},
		{"PanicAfterInitRecoveredAndShutDown", func(s *dgxa100.Server) {
			s.DeviceGetCountFunc = nil // the mock panics on a call it has no func for
		}, schemas.AcceleratorFacts{}, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := dgx(t)
			tc.spoil(s)
			shutdowns := 0
			s.ShutdownFunc = func() nvml.Return { shutdowns++; return nvml.SUCCESS }
			got := probe(t, s)
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("Probe = %+v\nwant    %+v", got, tc.want)
			}
			if shutdowns != tc.wantShutdown {
				t.Fatalf("Shutdown called %d times, want %d (exactly once after a successful Init)", shutdowns, tc.wantShutdown)
			}
		})
	}
}

// TestProbe_MissingEntryPointsAreNotCalled: an old driver without the
// health and MIG entry points is read without calling them (a missing
// lazily bound symbol would kill the probe).
func TestProbe_MissingEntryPointsAreNotCalled(t *testing.T) {
	s := dgx(t)
	missing := errors.New("undefined symbol")
	s.LookupSymbolFunc = func(sym string) error {
		switch sym {
		case "nvmlDeviceGetRemappedRows", "nvmlDeviceGetRetiredPagesPendingStatus", "nvmlDeviceGetMigMode", "nvmlEventSetCreate":
			return missing
		}
		return nil
	}
	for _, d := range s.Devices {
		d := d.(*dgxa100.Device)
		d.GetRemappedRowsFunc, d.GetRetiredPagesPendingStatusFunc, d.GetMigModeFunc = nil, nil, nil // calling them panics
	}
	s.EventSetCreateFunc = nil
	got := probe(t, s, WithXIDWindow(time.Second))
	if got.GPUCount() != 8 || !got.Cards[0].Healthy() || got.Cards[0].MIGMode != "" {
		t.Fatalf("old driver read as %+v", got)
	}
}

func TestProbe_CancelledMidReadStatesNothing(t *testing.T) {
	s := dgx(t)
	shutdowns := 0
	s.ShutdownFunc = func() nvml.Return { shutdowns++; return nvml.SUCCESS }
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	got := New(s, zaptest.NewLogger(t)).Probe(ctx)
	if got.Established {
		t.Fatalf("Probe with an ended context = %+v, want nothing established", got)
	}
	if shutdowns != 1 {
		t.Fatalf("Shutdown called %d times, want 1", shutdowns)
	}
}

func TestCUDACapability(t *testing.T) {
	for v, want := range map[int]string{12040: "12.4", 11080: "11.8", 12000: "12.0", 13010: "13.1", 0: "", -1: ""} {
		if got := cudaCapability(v); got != want {
			t.Errorf("cudaCapability(%d) = %q, want %q", v, got, want)
		}
	}
}

func TestMIGMemoryGB(t *testing.T) {
	const gib = uint64(1) << 30
	for _, c := range []struct {
		card, profileMB, want uint64
	}{
		{40 * gib, 4864, 5}, {40 * gib, 9856, 10}, {40 * gib, 19968, 20}, {40 * gib, 40192, 40},
		{80 * gib, 9856, 10}, {80 * gib, 19968, 20}, {80 * gib, 81408, 80},
		{0, 4864, 5},
	} {
		if got := migMemoryGB(c.card, c.profileMB); got != c.want {
			t.Errorf("migMemoryGB(%d GiB, %d MiB) = %d, want %d", c.card/gib, c.profileMB, got, c.want)
		}
	}
}
