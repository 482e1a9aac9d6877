package shadeformtest

import (
	"encoding/json"
	"slices"
	"time"
)

// InstanceType is one entry of GET /instances/types.
type InstanceType struct {
	Cloud             string         `json:"cloud"`
	Region            string         `json:"region"`
	ShadeInstanceType string         `json:"shade_instance_type"`
	CloudInstanceType string         `json:"cloud_instance_type"`
	Configuration     Configuration  `json:"configuration"`
	HourlyPrice       int64          `json:"hourly_price"`
	Availability      []Availability `json:"availability"`
	BootTime          *BootTime      `json:"boot_time,omitempty"`
}

// BootTime is an instance type's boot-time estimate.
type BootTime struct {
	MinBootInSec int64 `json:"min_boot_in_sec"`
	MaxBootInSec int64 `json:"max_boot_in_sec"`
}

// Configuration is an instance type's hardware.
type Configuration struct {
	MemoryInGB     int64    `json:"memory_in_gb"`
	StorageInGB    int64    `json:"storage_in_gb"`
	VCPUs          int64    `json:"vcpus"`
	NumGPUs        int64    `json:"num_gpus"`
	GPUType        string   `json:"gpu_type"`
	Interconnect   string   `json:"interconnect"`
	VRAMPerGPUInGB int64    `json:"vram_per_gpu_in_gb"`
	OSOptions      []string `json:"os_options,omitempty"`
}

// Availability is one region's stock of an instance type.
type Availability struct {
	Region     string `json:"region"`
	Available  bool   `json:"available"`
	RentalType string `json:"rental_type,omitempty"`
}

// DefaultTypes is a small catalogue: an A100 in stock in one region and not
// another (plus a spot-only region), an 8xH100 in stock, and an 8xB200 out
// of stock everywhere.
func DefaultTypes() []InstanceType {
	return []InstanceType{
		{Cloud: "massedcompute", Region: "us-central-2", ShadeInstanceType: "A100_80G", CloudInstanceType: "gpu_1x_a100_80g",
			Configuration: Configuration{MemoryInGB: 128, StorageInGB: 512, VCPUs: 16, NumGPUs: 1, GPUType: "A100_80G", Interconnect: "pcie", VRAMPerGPUInGB: 80},
			HourlyPrice:   180, BootTime: &BootTime{MinBootInSec: 180, MaxBootInSec: 300},
			Availability: []Availability{{Region: "us-central-2", Available: true}, {Region: "us-east-1", Available: false},
				{Region: "eu-west-1", Available: true, RentalType: "spot"}}},
		{Cloud: "hyperstack", Region: "canada-1", ShadeInstanceType: "H100_sxm5x8", CloudInstanceType: "n3-H100x8",
			Configuration: Configuration{MemoryInGB: 1800, StorageInGB: 32000, VCPUs: 192, NumGPUs: 8, GPUType: "H100", Interconnect: "sxm5", VRAMPerGPUInGB: 80},
			HourlyPrice:   1999,
			Availability:  []Availability{{Region: "canada-1", Available: true}}},
		{Cloud: "datacrunch", Region: "FIN-01", ShadeInstanceType: "B200x8", CloudInstanceType: "8B200.240V",
			Configuration: Configuration{MemoryInGB: 2000, StorageInGB: 20000, VCPUs: 240, NumGPUs: 8, GPUType: "B200", Interconnect: "sxm6", VRAMPerGPUInGB: 192},
			HourlyPrice:   3999,
			Availability:  []Availability{{Region: "FIN-01", Available: false}}},
	}
}

// Instance is one instance as the server keeps it.
type Instance struct {
	ID                string
	CloudAssignedID   string
	Cloud             string
	Region            string
	ShadeInstanceType string
	Configuration     Configuration
	Name              string
	IP                string
	Status            string
	HourlyPrice       int64
	Tags              []string
	CreatedAt         time.Time
	ActiveAt          time.Time
	DeletedAt         time.Time
	// AutoDeleteAt is the create request's auto_delete.date_threshold.
	AutoDeleteAt time.Time
	// Script is the decoded startup script the machine was given.
	Script []byte
	// Request is the create request body as received.
	Request json.RawMessage

	activeDue time.Time // when pending turns active
	deleteDue time.Time // when deleting turns deleted
}

// settle applies every transition due by now.
func (in *Instance) settle(now time.Time) {
	if in.Status == "deleted" {
		return
	}
	if !in.AutoDeleteAt.IsZero() && !in.AutoDeleteAt.After(now) && (in.deleteDue.IsZero() || in.AutoDeleteAt.Before(in.deleteDue)) {
		if in.Status == "pending" && !in.activeDue.After(in.AutoDeleteAt) {
			in.Status, in.ActiveAt = "active", in.activeDue
		}
		in.Status, in.DeletedAt, in.IP = "deleted", in.AutoDeleteAt, ""
		return
	}
	if in.Status == "pending" && !in.activeDue.After(now) {
		in.Status, in.ActiveAt, in.IP = "active", in.activeDue, "198.51.100."+in.ID[len(in.ID)-2:]
	}
	if in.Status == "deleting" && !in.deleteDue.After(now) {
		in.Status, in.DeletedAt, in.IP = "deleted", in.deleteDue, ""
	}
}

func (in *Instance) clone() Instance {
	c := *in
	c.Tags = slices.Clone(in.Tags)
	c.Script = slices.Clone(in.Script)
	c.Request = slices.Clone(in.Request)
	return c
}

// wire renders the documented instance record, launch configuration
// included (which is why the adapter must never echo it).
func (in *Instance) wire() map[string]any {
	stampOrNil := func(t time.Time) any {
		if t.IsZero() {
			return nil
		}
		return t.UTC().Format("2006-01-02T15:04:05.000Z")
	}
	var launch any
	if len(in.Request) > 0 {
		var req struct {
			LaunchConfiguration json.RawMessage `json:"launch_configuration"`
		}
		if json.Unmarshal(in.Request, &req) == nil {
			launch = req.LaunchConfiguration
		}
	}
	return map[string]any{
		"id": in.ID, "cloud": in.Cloud, "region": in.Region, "shade_instance_type": in.ShadeInstanceType,
		"cloud_instance_type": in.ShadeInstanceType + "-native", "cloud_assigned_id": in.CloudAssignedID,
		"shade_cloud": true, "name": in.Name, "configuration": in.Configuration, "ip": in.IP,
		"ssh_user": "shadeform", "ssh_port": 22, "status": in.Status, "cost_estimate": "0.0",
		"hourly_price": in.HourlyPrice, "launch_configuration": launch, "tags": in.Tags,
		"created_at": stampOrNil(in.CreatedAt), "active_at": stampOrNil(in.ActiveAt), "deleted_at": stampOrNil(in.DeletedAt),
	}
}
