package gpuprobe

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"unicode/utf8"

	"github.com/warmfleet/warmfleet/schemas"
)

// Bounds on what a probe may state; anything past them is malformed.
const (
	// MaxOutputBytes bounds the probe's stdout.
	MaxOutputBytes = 1 << 20
	maxCards       = 256
	maxMIGPerCard  = 64
	maxString      = 256
	maxHealth      = 1024 // reasons joined by "; "
)

// ErrMalformed: the probe's output is not one well-formed, plausible
// schemas.AcceleratorFacts.
var ErrMalformed = errors.New("malformed GPU probe output")

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, args...))
}

// Decode reads the JSON cmd/warmfleet-gpu-probe prints: one object, no
// unknown fields, nothing after it, every list and string within bounds,
// card indexes unique. Facts that are not Established decode to the zero
// value. CDI names are the agent's to add, so any in the input are dropped.
func Decode(data []byte) (schemas.AcceleratorFacts, error) {
	if len(data) > MaxOutputBytes {
		return schemas.AcceleratorFacts{}, malformed("%d bytes, more than %d", len(data), MaxOutputBytes)
	}
	if !utf8.Valid(data) {
		// encoding/json would quietly turn the bad bytes into U+FFFD.
		return schemas.AcceleratorFacts{}, malformed("not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var f schemas.AcceleratorFacts
	if err := dec.Decode(&f); err != nil {
		return schemas.AcceleratorFacts{}, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return schemas.AcceleratorFacts{}, malformed("data after the facts object")
	}
	if !f.Established {
		return schemas.AcceleratorFacts{}, nil
	}
	if err := check(&f); err != nil {
		return schemas.AcceleratorFacts{}, err
	}
	f.CDI = schemas.CDIFacts{}
	for i := range f.Cards {
		f.Cards[i].CDIDevices = nil
		for j := range f.Cards[i].MIGDevices {
			f.Cards[i].MIGDevices[j].CDIDevices = nil
		}
	}
	return f, nil
}

func checkString(field, s string) error {
	if len(s) > maxString || !utf8.ValidString(s) {
		return malformed("%s: not valid UTF-8 of at most %d bytes", field, maxString)
	}
	return nil
}

// check holds f within the bounds Decode promises.
func check(f *schemas.AcceleratorFacts) error {
	for field, s := range map[string]string{"vendor": f.Vendor, "driver_version": f.DriverVersion, "driver_capability": f.DriverCapability} {
		if err := checkString(field, s); err != nil {
			return err
		}
	}
	if f.Vendor == "" && (len(f.Cards) > 0 || len(f.Devices) > 0) {
		return malformed("cards without a vendor: a host with no driver has no cards")
	}
	if len(f.Devices) > maxCards || len(f.Cards) > maxCards {
		return malformed("more than %d cards", maxCards)
	}
	for i, d := range f.Devices {
		if err := checkString(fmt.Sprintf("devices[%d].model", i), d.Model); err != nil {
			return err
		}
		if d.Count < 0 || d.MemoryBytes < 0 {
			return malformed("devices[%d]: negative count or memory", i)
		}
	}
	seen := map[int]bool{}
	for i, c := range f.Cards {
		switch {
		case c.Index < 0 || c.Index >= maxCards || seen[c.Index]:
			return malformed("cards[%d]: index %d out of range or repeated", i, c.Index)
		case c.MemoryBytes < 0:
			return malformed("cards[%d]: negative memory", i)
		case len(c.Health) > maxHealth || !utf8.ValidString(c.Health):
			return malformed("cards[%d]: health not valid UTF-8 of at most %d bytes", i, maxHealth)
		case c.MIGMode != "" && c.MIGMode != schemas.MIGEnabled && c.MIGMode != schemas.MIGDisabled:
			return malformed("cards[%d]: MIG mode %q", i, c.MIGMode)
		case len(c.MIGDevices) > maxMIGPerCard:
			return malformed("cards[%d]: more than %d MIG devices", i, maxMIGPerCard)
		}
		seen[c.Index] = true
		for field, s := range map[string]string{"uuid": c.UUID, "model": c.Model} {
			if err := checkString(fmt.Sprintf("cards[%d].%s", i, field), s); err != nil {
				return err
			}
		}
		for j, m := range c.MIGDevices {
			if m.Index < 0 || m.MemoryBytes < 0 || m.GPUInstanceID < 0 || m.ComputeInstanceID < 0 {
				return malformed("cards[%d].mig_devices[%d]: negative number", i, j)
			}
			for field, s := range map[string]string{"uuid": m.UUID, "profile": m.Profile} {
				if err := checkString(fmt.Sprintf("cards[%d].mig_devices[%d].%s", i, j, field), s); err != nil {
					return err
				}
			}
		}
	}
	return nil
}
