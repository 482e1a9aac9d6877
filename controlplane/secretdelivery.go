package controlplane

import (
	"github.com/warmfleet/warmfleet/controlplane/intake"
)

// secretChecker is the store as intake's check that a Run's secrets exist.
// Without a store no secret is held: the check is nil, and intake refuses
// a Run naming one.
func (cp *ControlPlane) secretChecker() intake.SecretChecker {
	if cp.secrets == nil {
		return nil
	}
	return cp.secrets
}
