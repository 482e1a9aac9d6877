package nvml

import (
	"cmp"
	"slices"
	"strconv"

	"github.com/warmfleet/warmfleet/schemas"
)

// Vendor is what a host with a working NVIDIA driver states.
const Vendor = "nvidia"

// card is one device as NVML names it.
type card struct {
	model       string
	memoryBytes int64
}

// group counts identical cards, sorted by model then memory, so two hosts
// holding the same cards state the same list.
func group(cards []card) []schemas.AcceleratorDevice {
	if len(cards) == 0 {
		return nil
	}
	counts := map[card]int64{}
	for _, c := range cards {
		counts[c]++
	}
	out := make([]schemas.AcceleratorDevice, 0, len(counts))
	for c, n := range counts {
		out = append(out, schemas.AcceleratorDevice{Model: c.model, MemoryBytes: c.memoryBytes, Count: n})
	}
	slices.SortFunc(out, func(a, b schemas.AcceleratorDevice) int {
		return cmp.Or(cmp.Compare(a.Model, b.Model), cmp.Compare(a.MemoryBytes, b.MemoryBytes))
	})
	return out
}

// cudaCapability formats NVML's CUDA driver version (1000*major + 10*minor,
// e.g. 12040) as "12.4"; "" for a value NVML should never give.
func cudaCapability(v int) string {
	if v <= 0 {
		return ""
	}
	return strconv.Itoa(v/1000) + "." + strconv.Itoa(v%1000/10)
}
