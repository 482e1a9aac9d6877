package controlplane

import (
	"fmt"
	"slices"

	"github.com/warmfleet/warmfleet/schemas"
)

// checkTenants makes Tenants the sorted set of valid tenant names with
// schemas.DefaultTenant in it, and gives each an intake stream
// (Topology.Tenants). A name that cannot be a tenant is refused.
func (c *Config) checkTenants() error {
	ts := append([]string{schemas.DefaultTenant}, c.Tenants...)
	for _, t := range ts {
		if err := schemas.ValidateTenant("tenants", t); err != nil {
			return fmt.Errorf("controlplane: tenant %q: %w", t, err)
		}
	}
	slices.Sort(ts)
	c.Tenants = slices.Compact(ts)
	c.Topology.Tenants = c.Tenants
	return nil
}
