package shadeform

import (
	"encoding/json"
	"net/url"
	"strings"
	"time"

	"github.com/warmfleet/warmfleet/adapters/capacity"
)

// stateOf maps Shadeform's instance status onto capacity.State. The
// documented statuses are pending, active and deleted; creating,
// pending_provider, error and deleting are seen in clients of the live API.
// Every pre-active status is one stage for us (provisioning), which is what
// lets created_at date it.
func stateOf(status string) capacity.State {
	switch strings.ToLower(status) {
	case "creating", "pending_provider", "pending":
		return capacity.StateProvisioning
	case "active":
		return capacity.StateRunning
	case "deleting":
		return capacity.StateTerminating
	case "deleted":
		return capacity.StateTerminated
	case "error":
		return capacity.StateFailed
	}
	return capacity.StateUnknown
}

// stateSince is when the instance entered its state, by Shadeform's own
// dates, or zero when Shadeform does not date that transition.
func stateSince(w wireInstance) time.Time {
	switch stateOf(w.Status) {
	case capacity.StateProvisioning:
		return w.CreatedAt.Time
	case capacity.StateRunning:
		return w.ActiveAt.Time
	case capacity.StateTerminated:
		return w.DeletedAt.Time
	}
	return time.Time{}
}

// price converts an hourly price in cents. Shadeform's hourly_price leaves
// out its platform fee, so it is never exact; USD is assumed (the API names
// no currency).
func price(cents num) capacity.Price {
	return capacity.Price{Currency: "USD", MicrosPerHour: cents.count(maxCents) * capacity.MicrosPerCent}
}

// offerID names a (cloud, region, instance type) triple. Each part is
// path-escaped so the ID is printable ASCII whatever the names hold.
func offerID(cloud, region, shadeType string) string {
	return url.PathEscape(cloud) + "/" + url.PathEscape(region) + "/" + url.PathEscape(shadeType)
}

// parseOfferID undoes offerID.
func parseOfferID(id string) (cloud, region, shadeType string, ok bool) {
	parts := strings.Split(id, "/")
	if len(parts) != 3 {
		return "", "", "", false
	}
	for i, p := range parts {
		u, err := url.PathUnescape(p)
		if err != nil || u == "" {
			return "", "", "", false
		}
		parts[i] = u
	}
	return parts[0], parts[1], parts[2], true
}

// offersOf expands each instance type into one offer per region it lists,
// skipping spot entries (this adapter rents on-demand only). Duplicate
// regions merge, available if any entry says so.
func offersOf(types []wireInstanceType) []capacity.Offer {
	var out []capacity.Offer
	index := map[string]int{}
	for _, t := range types {
		if t.Cloud == "" || t.ShadeInstanceType == "" {
			continue
		}
		avail := t.Availability
		if len(avail) == 0 && t.Region != "" {
			avail = []wireAvailability{{Region: t.Region}}
		}
		c := t.Configuration
		for _, a := range avail {
			if a.Region == "" || !onDemand(a.RentalType) {
				continue
			}
			id := offerID(t.Cloud, a.Region, t.ShadeInstanceType)
			if i, ok := index[id]; ok {
				out[i].Available = out[i].Available || a.Available
				continue
			}
			index[id] = len(out)
			out = append(out, capacity.Offer{
				ID: id, Provider: Type, Cloud: t.Cloud, Region: a.Region,
				GPUModel:       c.GPUType,
				GPUCount:       c.NumGPUs.count(maxCount),
				GPUMemoryBytes: c.VRAMPerGPUInGB.count(maxCount) << 30,
				CPUMillis:      c.VCPUs.count(maxCount) * 1000,
				MemoryBytes:    c.MemoryInGB.count(maxCount) << 30,
				DiskBytes:      c.StorageInGB.count(maxCount) << 30,
				PricePerHour:   price(t.HourlyPrice),
				Available:      a.Available,
				ReadySeconds:   readySeconds(t.BootTime),
			})
		}
	}
	return out
}

func onDemand(rentalType string) bool {
	switch strings.ToLower(strings.ReplaceAll(rentalType, "-", "_")) {
	case "", "on_demand", "ondemand":
		return true
	}
	return false
}

// nativeJSONFields is what an observation may repeat of Shadeform's record.
// It is an allow-list: the launch configuration (our startup script, with
// the enrollment token inside) and environment values never leave.
var nativeJSONFields = map[string]bool{
	"id": true, "cloud": true, "region": true, "shade_instance_type": true, "cloud_instance_type": true,
	"cloud_assigned_id": true, "shade_cloud": true, "name": true, "configuration": true, "ip": true,
	"ssh_user": true, "ssh_port": true, "status": true, "status_details": true, "cost_estimate": true,
	"hourly_price": true, "tags": true, "created_at": true, "active_at": true, "deleted_at": true,
	"volume_ids": true, "port_mappings": true,
}

// nativeJSON keeps the allowed fields of an instance record.
func nativeJSON(body []byte) string {
	var fields map[string]json.RawMessage
	if json.Unmarshal(body, &fields) != nil {
		return ""
	}
	for k := range fields {
		if !nativeJSONFields[k] {
			delete(fields, k)
		}
	}
	out, err := json.Marshal(fields)
	if err != nil {
		return ""
	}
	return string(out)
}

// readySeconds is the pessimistic end of Shadeform's boot-time estimate,
// zero when it gives none.
func readySeconds(b *wireBootTime) int64 {
	if b == nil {
		return 0
	}
	const day = 24 * 3600
	return b.MaxBootInSec.count(day)
}
