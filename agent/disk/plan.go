package disk

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/warmfleet/warmfleet/schemas"
)

// snapshot is what a collection decides over: the content disk, every
// image and cache the node holds (with size and last use), and what may
// not be removed, by itemKey, with why.
type snapshot struct {
	Disk  schemas.DiskFacts
	Items []schemas.DiskItem
	// Busy: used by a workload that is running or not yet removed, or
	// prepared for an attempt that has not ended.
	Busy map[string]string
	// Keep: what the control plane says Runs booked or queued here need.
	Keep map[string]string
}

// plan is a collection's choice.
type plan struct {
	// Order is every removable item, least recently used first, each with
	// the reason it would go.
	Order []schemas.DiskItem
	// Evict is how many of Order the plan expects to remove: until the
	// disk is projected at or below the low watermark, or all of them for
	// a prune. Item sizes are estimates (images share layers), so the
	// collector re-measures the disk as it goes and walks on down Order
	// while it is still above.
	Evict int
	// Kept are the items not removable, each with why.
	Kept []schemas.DiskItem
}

func itemKey(kind, id string) string { return kind + ":" + id }

// busy marks each non-empty id of kind busy for why, unless an earlier
// holder already did.
func (s snapshot) busy(kind string, ids []string, why string) {
	for _, id := range ids {
		if k := itemKey(kind, id); id != "" && s.Busy[k] == "" {
			s.Busy[k] = why
		}
	}
}

// usedPercent is the share of the disk in use, in percent.
func usedPercent(d schemas.DiskFacts) float64 {
	if !d.Known || d.TotalBytes <= 0 {
		return 0
	}
	return 100 * float64(d.TotalBytes-d.FreeBytes) / float64(d.TotalBytes)
}

// overHigh says a collection is due: the disk is known and more than the
// high watermark of it is used.
func overHigh(d schemas.DiskFacts, w schemas.DiskWatermarks) bool {
	return d.Known && usedPercent(d) > float64(w.High)
}

// atOrBelowLow says a collection may stop.
func atOrBelowLow(d schemas.DiskFacts, w schemas.DiskWatermarks) bool {
	return !d.Known || usedPercent(d) <= float64(w.Low)
}

// planWatermarks chooses what a collection removes: nothing while the disk
// is at or below the high watermark; past it, least recently used first
// until the projected use is at or below the low watermark.
func planWatermarks(s snapshot, w schemas.DiskWatermarks) plan {
	p := order(s, fmt.Sprintf("least recently used; disk %.0f%% used, above the %d%% high watermark (collecting to %d%%)",
		usedPercent(s.Disk), w.High, w.Low))
	if !overHigh(s.Disk, w) {
		p.Evict = 0
		return p
	}
	d := s.Disk
	for p.Evict < len(p.Order) && !atOrBelowLow(d, w) {
		d.FreeBytes = min(d.FreeBytes+p.Order[p.Evict].SizeBytes, d.TotalBytes)
		p.Evict++
	}
	return p
}

// planPrune chooses everything removable: an operator's prune does not
// stop at a watermark.
func planPrune(s snapshot) plan {
	p := order(s, "pruned by an operator: nothing running or booked uses it")
	p.Evict = len(p.Order)
	return p
}

// order splits the items into the removable ones, least recently used
// first (never-used ones first of all; then the larger; then by kind and
// id, so a plan is the same every time), and the kept ones with why.
func order(s snapshot, why string) plan {
	var p plan
	for _, it := range s.Items {
		k := itemKey(it.Kind, it.ID)
		switch {
		case s.Busy[k] != "":
			it.Reason = s.Busy[k]
			p.Kept = append(p.Kept, it)
		case s.Keep[k] != "":
			it.Reason = s.Keep[k]
			p.Kept = append(p.Kept, it)
		default:
			it.Reason = why
			p.Order = append(p.Order, it)
		}
	}
	slices.SortFunc(p.Order, func(a, b schemas.DiskItem) int {
		return cmp.Or(a.LastUsedAt.Compare(b.LastUsedAt), cmp.Compare(b.SizeBytes, a.SizeBytes),
			cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.ID, b.ID))
	})
	slices.SortFunc(p.Kept, func(a, b schemas.DiskItem) int { return cmp.Or(cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.ID, b.ID)) })
	return p
}

// keepSet indexes the control plane's keep list by itemKey.
func keepSet(k schemas.DiskKeep) map[string]string {
	out := make(map[string]string, len(k.Items))
	for _, it := range k.Items {
		why := it.Reason
		if why == "" {
			why = "kept by the control plane"
		}
		out[itemKey(it.Kind, it.ID)] = why
	}
	return out
}

// lastUsed formats a last-use time for logs; zero is "never".
func lastUsed(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return t.UTC().Format(time.RFC3339)
}
