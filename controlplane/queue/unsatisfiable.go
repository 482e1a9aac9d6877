package queue

import "github.com/warmfleet/warmfleet/schemas"

// Permanent reports whether a rejection holds whatever the node's current
// load: the node can never run this request as it is.
func Permanent(code schemas.Code) bool {
	switch code {
	case schemas.ReasonInsufficientCPU, schemas.ReasonInsufficientMemory, schemas.ReasonInsufficientGPU,
		schemas.ReasonInsufficientDisk, schemas.ReasonGPUModelMismatch, schemas.ReasonGPUNotInjectable, schemas.ReasonDriverMissing,
		schemas.ReasonDriverTooOld, schemas.ReasonPlatformMismatch, schemas.ReasonNetworkUnavailable, schemas.ReasonCacheMountsUnsupported:
		return true
	}
	return false
}

// Unsatisfiable reports whether every node rejects the Run for a reason
// that waiting will not change.
func Unsatisfiable(d schemas.BookingDecision) bool {
	if len(d.Candidates) == 0 {
		return false // no nodes yet: one may enroll
	}
	for _, c := range d.Candidates {
		if c.Eligible || !Permanent(c.Reason) {
			return false
		}
	}
	return true
}

// noneEligible reports whether d found no node that could run the Run now
// or queue it.
func noneEligible(d *schemas.BookingDecision) bool {
	if d.Winner != "" {
		return false
	}
	for _, c := range d.Candidates {
		if c.Eligible {
			return false
		}
	}
	return true
}
