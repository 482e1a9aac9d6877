package gpuprobe

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/warmfleet/warmfleet/schemas"
)

// probeFacts is a full probe answer: two cards, one unhealthy with MIG.
func probeFacts() schemas.AcceleratorFacts {
	cards := []schemas.GPUCard{
		{Index: 0, UUID: "GPU-0", Model: "NVIDIA A100-SXM4-40GB", MemoryBytes: 40 << 30, MIGMode: schemas.MIGDisabled, Health: schemas.GPUHealthOK},
		{Index: 1, UUID: "GPU-1", Model: "NVIDIA A100-SXM4-40GB", MemoryBytes: 40 << 30, MIGMode: schemas.MIGEnabled, Health: "XID 79 critical error",
			MIGDevices: []schemas.MIGDevice{{Index: 0, UUID: "MIG-a", Profile: "1g.5gb", MemoryBytes: 5 << 30, GPUInstanceID: 7}}},
		{Index: 2, Health: "unreadable: nvml device handle: GPU is lost"},
	}
	return schemas.AcceleratorFacts{Established: true, Vendor: "nvidia", DriverVersion: "580.159.04", DriverCapability: "13.0",
		Devices: schemas.GroupCards(cards), Cards: cards}
}

func TestDecode_RoundTrip(t *testing.T) {
	for _, in := range []schemas.AcceleratorFacts{probeFacts(), {Established: true}, {}} {
		b, err := json.Marshal(in)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Decode(b)
		if err != nil {
			t.Fatalf("Decode(%s): %v", b, err)
		}
		if !reflect.DeepEqual(got, in) {
			t.Fatalf("round trip of %s:\n got %+v\nwant %+v", b, got, in)
		}
	}
	if got := probeFacts().GPUCount(); got != 2 {
		t.Fatalf("the lost card counted: %d", got)
	}
}

func TestDecode_DropsCDIAndUnestablishedFacts(t *testing.T) {
	in := probeFacts()
	in.Cards[0].CDIDevices = []string{"nvidia.com/gpu=0"}
	in.CDI = schemas.CDIFacts{Scanned: true, Devices: []string{"nvidia.com/gpu=0"}}
	b, _ := json.Marshal(in)
	got, err := Decode(b)
	if err != nil || got.CDI.Scanned || got.Cards[0].CDIDevices != nil {
		t.Fatalf("Decode kept the probe's CDI claims: %+v, %v", got, err)
	}
	got, err = Decode([]byte(`{"established":false,"vendor":"nvidia","cards":[{"index":0,"health":"ok"}]}`))
	if err != nil || !reflect.DeepEqual(got, schemas.AcceleratorFacts{}) {
		t.Fatalf("unestablished facts decode as %+v, %v", got, err)
	}
}

func TestDecode_RefusesMalformed(t *testing.T) {
	for name, in := range map[string]string{
		"Empty":         ``,
		"Array":         `[]`,
		"Trailing":      `{"established":true} x`,
		"Unknown":       `{"established":true,"extra":1}`,
		"BadUTF8":       "{\"established\":true,\"vendor\":\"\xff\"}",
		"NegativeIndex": `{"established":true,"vendor":"nvidia","cards":[{"index":-1,"health":"ok"}]}`,
		"MIGMode":       `{"established":true,"vendor":"nvidia","cards":[{"index":0,"health":"ok","mig_mode":"maybe"}]}`,
		"LongHealth":    `{"established":true,"vendor":"nvidia","cards":[{"index":0,"health":"` + strings.Repeat("x", 2000) + `"}]}`,
		"NegativeCount": `{"established":true,"vendor":"nvidia","devices":[{"model":"x","memory_bytes":1,"count":-2}]}`,
	} {
		if _, err := Decode([]byte(in)); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: Decode(%q) = %v, want ErrMalformed", name, in, err)
		}
	}
}

// FuzzDecode: any input either decodes to facts that survive a second
// round trip unchanged, or is refused as ErrMalformed. Never a panic.
func FuzzDecode(f *testing.F) {
	b, _ := json.Marshal(probeFacts())
	f.Add(b)
	f.Add([]byte(`{"established":true}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := Decode(data)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v is not ErrMalformed", err)
			}
			return
		}
		again, err := json.Marshal(got)
		if err != nil {
			t.Fatalf("decoded facts do not encode: %v", err)
		}
		back, err := Decode(again)
		if err != nil {
			t.Fatalf("decoded facts %s do not decode again: %v", again, err)
		}
		if !reflect.DeepEqual(normal(back), normal(got)) {
			t.Fatalf("second round trip changed the facts:\n%+v\n%+v", got, back)
		}
		if got.Vendor == "" && len(got.Cards) > 0 {
			t.Fatalf("cards without a vendor accepted: %+v", got)
		}
	})
}

// normal maps empty slices to nil: JSON cannot tell them apart.
func normal(a schemas.AcceleratorFacts) string {
	b, _ := json.Marshal(a)
	return string(b)
}
