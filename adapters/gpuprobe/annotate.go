package gpuprobe

import (
	"slices"
	"strconv"

	"github.com/warmfleet/warmfleet/schemas"
)

// NVIDIAKind is the CDI device kind nvidia-ctk declares NVIDIA cards under.
const NVIDIAKind = "nvidia.com/gpu"

// Annotate names each NVIDIA card (and MIG instance) by the CDI devices
// the host's specs offer for it, from a.CDI.Devices: "<kind>=<uuid>" then
// "<kind>=<index>" for a card, "<kind>=<mig uuid>" then
// "<kind>=<card>:<mig index>" for a MIG instance, as nvidia-ctk cdi
// generate names them. The UUID's name comes first because placement books
// a card by its first name (schemas.AcceleratorFacts.CDIDevicesFor), and an
// index may name another card after a reboot. A card left without names
// has no usable CDI spec.
func Annotate(a *schemas.AcceleratorFacts) {
	if a.Vendor != "nvidia" {
		return
	}
	offered := make(map[string]bool, len(a.CDI.Devices))
	for _, d := range a.CDI.Devices {
		offered[d] = true
	}
	names := func(ids ...string) []string {
		var out []string
		for _, id := range ids {
			if n := NVIDIAKind + "=" + id; id != "" && offered[n] && !slices.Contains(out, n) {
				out = append(out, n)
			}
		}
		return out
	}
	for i := range a.Cards {
		c := &a.Cards[i]
		idx := strconv.Itoa(c.Index)
		if c.UUID == "" {
			// Unreadable: an index name could point at whichever card now
			// answers to it.
			c.CDIDevices = nil
		} else {
			c.CDIDevices = names(c.UUID, idx)
		}
		for j := range c.MIGDevices {
			m := &c.MIGDevices[j]
			m.CDIDevices = names(m.UUID, idx+":"+strconv.Itoa(m.Index))
		}
	}
}
