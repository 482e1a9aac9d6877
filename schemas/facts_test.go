package schemas_test

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/schemas"
)

// twoCards is a host with two named cards, one offered through CDI, one MIG
// card, and a CDI spec error.
func twoCards() schemas.AcceleratorFacts {
	return schemas.AcceleratorFacts{
		Established: true, Vendor: "nvidia", DriverVersion: "550.54.15", DriverCapability: "12.4",
		Devices: []schemas.AcceleratorDevice{{Model: "NVIDIA A100-SXM4-40GB", MemoryBytes: 40 << 30, Count: 2}},
		Cards: []schemas.GPUCard{
			{Index: 0, UUID: "GPU-0000", Model: "NVIDIA A100-SXM4-40GB", MemoryBytes: 40 << 30, MIGMode: schemas.MIGDisabled,
				Health: schemas.GPUHealthOK, CDIDevices: []string{"nvidia.com/gpu=GPU-0000", "nvidia.com/gpu=0"}},
			{Index: 1, UUID: "GPU-1111", Model: "NVIDIA A100-SXM4-40GB", MemoryBytes: 40 << 30, MIGMode: schemas.MIGEnabled,
				MIGDevices: []schemas.MIGDevice{{Index: 0, UUID: "MIG-aaaa", Profile: "1g.5gb", MemoryBytes: 5 << 30, GPUInstanceID: 7,
					CDIDevices: []string{"nvidia.com/gpu=1:0"}}},
				Health: "remapped rows pending: the card needs a reset"},
		},
		CDI: schemas.CDIFacts{Scanned: true, SpecDirs: []string{"/etc/cdi", "/var/run/cdi"},
			Devices: []string{"nvidia.com/gpu=0", "nvidia.com/gpu=1:0", "nvidia.com/gpu=GPU-0000", "nvidia.com/gpu=all"},
			Errors:  []schemas.CDISpecError{{Path: "/etc/cdi/bad.yaml", Reason: "failed to parse"}}},
	}
}

func TestAcceleratorFacts_RoundTripsBothCodecs(t *testing.T) {
	in := schemas.NodeFacts{Host: schemas.HostFacts{OS: "linux", Architecture: "amd64", Accelerator: twoCards()}}
	for _, enc := range []codec.Encoding{codec.JSON, codec.MsgPack} {
		data, err := codec.Encode(enc, in)
		if err != nil {
			t.Fatal(err)
		}
		var out schemas.NodeFacts
		if err := codec.Decode(enc, data, &out); err != nil {
			t.Fatalf("%v: %v", enc, err)
		}
		if !reflect.DeepEqual(out.Host.Accelerator, in.Host.Accelerator) {
			t.Fatalf("%v round trip:\n got %+v\nwant %+v", enc, out.Host.Accelerator, in.Host.Accelerator)
		}
	}
	// An older report (no cards, no CDI) still reads, with CDI unscanned.
	var old schemas.AcceleratorFacts
	if err := json.Unmarshal([]byte(`{"established":true,"vendor":"nvidia","devices":[{"model":"L4","memory_bytes":1,"count":1}]}`), &old); err != nil {
		t.Fatal(err)
	}
	if old.GPUCount() != 1 || old.CDI.Scanned || len(old.Cards) != 0 {
		t.Fatalf("old report read as %+v", old)
	}
	// An unscanned CDI block is left out of the JSON.
	b, _ := json.Marshal(schemas.AcceleratorFacts{Established: true})
	if string(b) != `{"established":true}` {
		t.Fatalf("no-driver facts encode as %s", b)
	}
}

func TestNormalize_AcceleratorRules(t *testing.T) {
	norm := func(a schemas.AcceleratorFacts) schemas.AcceleratorFacts {
		f := schemas.NodeFacts{Host: schemas.HostFacts{Accelerator: a}}
		f.Normalize()
		return f.Host.Accelerator
	}
	t.Run("NotEstablishedErasesEverything", func(t *testing.T) {
		a := twoCards()
		a.Established = false
		if got := norm(a); !reflect.DeepEqual(got, schemas.AcceleratorFacts{}) {
			t.Fatalf("got %+v", got)
		}
	})
	t.Run("NoVendorMeansNoCardsButKeepsCDI", func(t *testing.T) {
		a := twoCards()
		a.Vendor = ""
		got := norm(a)
		if !got.Established || len(got.Cards) != 0 || len(got.Devices) != 0 || got.DriverVersion != "" || got.GPUCount() != 0 {
			t.Fatalf("got %+v, want established, no driver, no cards", got)
		}
		if !got.CDI.Scanned || len(got.CDI.Devices) != 4 {
			t.Fatalf("CDI facts lost: %+v", got.CDI)
		}
	})
	t.Run("UnscannedCDINamesNothing", func(t *testing.T) {
		a := twoCards()
		a.CDI.Scanned = false
		got := norm(a)
		if !reflect.DeepEqual(got.CDI, schemas.CDIFacts{}) || got.Cards[0].CDIDevices != nil || got.Cards[1].MIGDevices[0].CDIDevices != nil {
			t.Fatalf("unscanned CDI still names devices: %+v", got)
		}
	})
	t.Run("KeepsAWellFormedReport", func(t *testing.T) {
		if got := norm(twoCards()); !reflect.DeepEqual(got, twoCards()) {
			t.Fatalf("got %+v", got)
		}
	})
}

func TestGPUCard_InjectableAndCDIDevicesFor(t *testing.T) {
	a := twoCards()
	if devs, ok := a.CDIDevicesFor([]string{"GPU-0000"}); !ok || len(devs) != 1 || devs[0] != "nvidia.com/gpu=GPU-0000" {
		t.Errorf("CDIDevicesFor(GPU-0000) = %v, %v; want the card's UUID name", devs, ok)
	}
	if _, ok := a.CDIDevicesFor([]string{"GPU-1111"}); ok {
		t.Error("a card without CDI names has a device")
	}
	if (schemas.GPUCard{}).Healthy() != true || (schemas.GPUCard{Health: "XID 79"}).Healthy() {
		t.Error("Healthy: an empty health counts as ok (placement reads it so), a reason does not")
	}
	if !a.Cards[0].Injectable() {
		t.Error("healthy whole card with CDI names is not injectable")
	}
	if a.Cards[1].Injectable() {
		t.Error("unhealthy MIG card is injectable")
	}
	noCDI := a.Cards[0]
	noCDI.CDIDevices = nil
	if noCDI.Injectable() {
		t.Error("a card no CDI spec names is injectable")
	}
	noUUID := a.Cards[0]
	noUUID.UUID = ""
	if noUUID.Injectable() {
		t.Error("a card without a UUID is injectable")
	}
}
