package schemas

import (
	"math"
	"unicode/utf8"
)

// Validate checks a usage record read back from WF_USAGE: it names a
// tenant-shaped tenant, its Run and attempt, and finite, non-negative
// amounts.
func (u UsageRecord) Validate() error {
	if err := ValidateTenant("tenant", u.Tenant); err != nil {
		return err
	}
	if err := ValidateID("run_id", u.RunID, CodeInvalidRunID); err != nil {
		return err
	}
	if u.AttemptID == "" || len(u.AttemptID) > 256 {
		return refuse(CodeMalformed, "attempt_id", "a usage record names its attempt (at most 256 bytes)")
	}
	if len(u.GPUModel) > 256 || !utf8.ValidString(u.GPUModel) {
		// It becomes a Prometheus label, which must be valid UTF-8.
		return refuse(CodeMalformed, "gpu_model", "at most 256 bytes of valid UTF-8")
	}
	if u.GPUs < 0 {
		return refuse(CodeMalformed, "gpus", "must not be negative")
	}
	for field, v := range map[string]float64{"cost_usd": u.CostUSD, "seconds": u.Seconds} {
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			return refuse(CodeMalformed, field, "must be a finite number, 0 or more")
		}
	}
	return nil
}
