package scheduler

import "github.com/warmfleet/warmfleet/schemas"

// permanent reports whether a rejection holds whatever the node's current
// load: the node can never run this request as it is.
func permanent(code schemas.Code) bool {
	switch code {
	case schemas.ReasonInsufficientCPU, schemas.ReasonInsufficientMemory, schemas.ReasonInsufficientGPU,
		schemas.ReasonInsufficientDisk, schemas.ReasonGPUModelMismatch, schemas.ReasonGPUNotInjectable, schemas.ReasonDriverMissing,
		schemas.ReasonDriverTooOld, schemas.ReasonPlatformMismatch, schemas.ReasonNetworkUnavailable, schemas.ReasonCacheMountsUnsupported:
		return true
	}
	return false
}

// unsatisfiable reports whether every node rejects the Run for a reason
// that waiting will not change.
func unsatisfiable(d schemas.BookingDecision) bool {
	if len(d.Candidates) == 0 {
		return false // no nodes yet: one may enroll
	}
	for _, c := range d.Candidates {
		if c.Eligible || !permanent(c.Reason) {
			return false
		}
	}
	return true
}
